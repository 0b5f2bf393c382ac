"""The scripted model and reference run torchscript_model_test.cpp loads.

cnn.pt: Conv(1->4) + BatchNorm + ReLU + Linear(4*6*6 -> 5), scripted.
io.pt: an input batch, its labels, the eval-mode logits, and the weights
and BatchNorm statistics after one SGD step (lr 0.1) in train mode.
Prints the state dict's keys.

Usage: export_scripted_cnn.py DIR
"""
import sys, torch
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.head = torch.nn.Linear(4 * 6 * 6, 5)
    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))
    @torch.jit.export
    def compute_loss(self, x, y):
        return {'loss_ce': torch.nn.functional.cross_entropy(self.forward(x), y)}
net = torch.jit.script(Net())
net.save(sys.argv[1] + '/cnn.pt')
x = torch.randn(6, 1, 8, 8)
y = torch.tensor([0, 1, 2, 3, 4, 0])
io = {'x': x, 'y': y}
net.eval()
io['eval_logits'] = net(x).detach()
net.train()
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
torch.nn.functional.cross_entropy(net(x), y).backward()
sgd.step()
for name, value in net.state_dict().items():
    io['after.' + name] = value.detach().clone()
torch.save(io, sys.argv[1] + '/io.pt')
print(' '.join(net.state_dict().keys()))
