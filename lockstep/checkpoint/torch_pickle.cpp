#include "lockstep/checkpoint/torch_pickle.h"

#include <cstring>
#include <limits>
#include <set>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

using Value = PickleValue*;

// Bounds that no state dict comes near and that keep hostile input cheap.
constexpr size_t kMaxStack = 1 << 20;
constexpr size_t kMaxMemo = 1 << 22;
constexpr int64_t kMaxDims = 64;

// The element type of a torch.save storage class ("torch.FloatStorage").
bool storage_dtype(const std::string& name, c10::ScalarType* type) {
  static const std::map<std::string, c10::ScalarType> types{
      {"torch.FloatStorage", c10::kFloat},         {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},           {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},           {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},         {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},           {"torch.BoolStorage", c10::kBool},
      {"torch.ComplexFloatStorage", c10::kComplexFloat}, {"torch.ComplexDoubleStorage", c10::kComplexDouble}};
  auto found = types.find(name);
  if (found == types.end()) return false;
  *type = found->second;
  return true;
}

bool is_allowed_global(const std::string& name) {
  static const std::set<std::string> allowed{"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                                             "torch._utils._rebuild_parameter",
                                             "torch._utils._rebuild_parameter_with_state",
                                             "torch.jit._pickle.restore_type_tag"};
  c10::ScalarType ignored;
  return allowed.count(name) > 0 || storage_dtype(name, &ignored);
}

class Machine {
 public:
  // `load_storage` empty: a plain pickle, where a persistent id is an error.
  Machine(const std::string& pickle, const StorageLoader& load_storage, const std::string& source,
          std::vector<std::unique_ptr<PickleValue>>& arena)
      : data_(pickle), load_storage_(load_storage), source_(source), arena_(arena) {}

  Value run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = byte();
      if (op == '.') {  // STOP
        check(stack_.size() == 1 && marks_.empty(), at, "the pickle ends with ", stack_.size(), " values on its stack");
        return stack_.back();
      }
      step(op, at);
      check(stack_.size() <= kMaxStack, at, "more than ", kMaxStack, " values on the stack");
    }
  }

 private:
  Value make(PickleValue::Kind kind) {
    arena_.push_back(std::make_unique<PickleValue>());
    arena_.back()->kind = kind;
    return arena_.back().get();
  }

  template <typename... Args>
  void check(bool ok, size_t at, Args&&... args) {
    if (!ok) LOCKSTEP_FAIL(source_, load_storage_ ? ": not a state dict torch.save could have written (data.pkl, byte "
                                                  : ": not a pickle lockstep reads (byte ",
                           at, "): ", std::forward<Args>(args)...);
  }

  uint8_t byte() {
    check(pos_ < data_.size(), pos_, "the pickle is truncated");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  std::string bytes(uint64_t count) {
    check(count <= data_.size() - pos_, pos_, "the pickle is truncated (", count, " bytes announced)");
    std::string out = data_.substr(pos_, static_cast<size_t>(count));
    pos_ += static_cast<size_t>(count);
    return out;
  }
  uint64_t little(int width) {
    uint64_t value = 0;
    for (int i = 0; i < width; ++i) value |= static_cast<uint64_t>(byte()) << (8 * i);
    return value;
  }
  std::string line() {
    const size_t end = data_.find('\n', pos_);
    check(end != std::string::npos, pos_, "the pickle is truncated (a line without its end)");
    std::string out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  Value pop(size_t at) {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()), at, "pops an empty stack");
    Value value = stack_.back();
    stack_.pop_back();
    return value;
  }
  // The values above the last MARK, removing them and the mark.
  std::vector<Value> pop_mark(size_t at) {
    check(!marks_.empty(), at, "no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Value> values(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return values;
  }
  Value top(size_t at) {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()), at, "reads an empty stack");
    return stack_.back();
  }

  Value tuple(std::vector<Value> items) {
    Value value = make(PickleValue::Kind::kTuple);
    value->items = std::move(items);
    return value;
  }
  void memo_put(uint64_t index, size_t at) {
    check(index < kMaxMemo, at, "memo index ", index, " is out of range");
    if (memo_.size() <= index) memo_.resize(static_cast<size_t>(index) + 1);
    memo_[static_cast<size_t>(index)] = top(at);
  }
  void memo_get(uint64_t index, size_t at) {
    check(index < memo_.size() && memo_[static_cast<size_t>(index)], at, "memo entry ", index, " was never stored");
    stack_.push_back(memo_[static_cast<size_t>(index)]);
  }
  // Any class may be named; only the known ones are ever "called". Others
  // become opaque objects (their arguments are read, nothing is run), so a
  // checkpoint with Python objects beside its state dict still loads.
  void global(const std::string& module, const std::string& name) {
    Value value = make(PickleValue::Kind::kGlobal);
    value->text = module + "." + name;
    stack_.push_back(value);
  }
  Value object_of(const std::string& class_name, const Value& args) {
    Value value = make(PickleValue::Kind::kObject);
    value->text = class_name;
    value->args = args;
    return value;
  }
  void set_items(Value dict, const std::vector<Value>& values, size_t at) {
    if (dict->kind == PickleValue::Kind::kObject) return;  // a dict subclass: opaque
    check(dict->kind == PickleValue::Kind::kDict, at, "SETITEM(S) on ", dict->describe());
    check(values.size() % 2 == 0, at, "SETITEMS with an odd number of values");
    for (size_t i = 0; i < values.size(); i += 2) dict->entries.emplace_back(values[i], values[i + 1]);
  }

  int64_t integer(const Value& value, size_t at, const char* what) {
    check(value->kind == PickleValue::Kind::kInt, at, what, " is ", value->describe(), ", not an int");
    return value->integer;
  }
  std::vector<int64_t> integers(const Value& value, size_t at, const char* what) {
    check(value->kind == PickleValue::Kind::kTuple && static_cast<int64_t>(value->items.size()) <= kMaxDims, at, what,
          " is ", value->describe(), ", not a tuple of at most ", kMaxDims, " ints");
    std::vector<int64_t> out;
    for (const auto& item : value->items) out.push_back(integer(item, at, what));
    return out;
  }

  // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
  Value rebuild_tensor(const std::vector<Value>& args, size_t at) {
    check(args.size() >= 4, at, "_rebuild_tensor_v2 with ", args.size(), " arguments");
    check(args[0]->kind == PickleValue::Kind::kStorage, at, "_rebuild_tensor_v2 of ", args[0]->describe());
    const torch::Tensor& storage = args[0]->tensor;
    const int64_t offset = integer(args[1], at, "a tensor's storage offset");
    const std::vector<int64_t> size = integers(args[2], at, "a tensor's size");
    const std::vector<int64_t> stride = integers(args[3], at, "a tensor's stride");
    check(size.size() == stride.size(), at, "a tensor with ", size.size(), " sizes and ", stride.size(), " strides");
    // The last element the view reaches must lie inside the storage.
    int64_t last = offset;
    bool empty = false;
    for (size_t d = 0; d < size.size(); ++d) {
      check(size[d] >= 0 && stride[d] >= 0 && size[d] < (int64_t{1} << 40) && stride[d] < (int64_t{1} << 40), at,
            "a tensor with size ", size[d], " and stride ", stride[d], " in dimension ", d);
      if (size[d] == 0) empty = true;
      if (size[d] > 0) last += (size[d] - 1) * stride[d];
      check(last < (int64_t{1} << 50), at, "a tensor reaching past any storage");
    }
    check(offset >= 0 && (empty || last < storage.numel()), at, "a tensor [offset ", offset, ", last element ", last,
          "] outside its storage of ", storage.numel(), " elements");
    Value value = make(PickleValue::Kind::kTensor);
    value->tensor = empty ? torch::empty(size, storage.options()) : storage.as_strided(size, stride, offset).clone();
    return value;
  }

  void reduce(size_t at) {
    Value args = pop(at);
    Value callable = pop(at);
    check(callable->kind == PickleValue::Kind::kGlobal, at, "REDUCE calls ", callable->describe());
    check(args->kind == PickleValue::Kind::kTuple, at, "REDUCE with arguments ", args->describe());
    const std::string& name = callable->text;
    if (!is_allowed_global(name)) {
      stack_.push_back(object_of(name, args));
    } else if (name == "collections.OrderedDict") {
      check(args->items.empty(), at, "OrderedDict with arguments");
      stack_.push_back(make(PickleValue::Kind::kDict));
    } else if (name == "torch._utils._rebuild_tensor_v2") {
      stack_.push_back(rebuild_tensor(args->items, at));
    } else if (name == "torch.jit._pickle.restore_type_tag") {
      // (value, "Dict[str, Tensor]"): libtorch's pickle_save tags typed containers.
      check(!args->items.empty(), at, "restore_type_tag without a value");
      stack_.push_back(args->items[0]);
    } else if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      check(!args->items.empty() && args->items[0]->kind == PickleValue::Kind::kTensor, at,
            "a Parameter of ", args->items.empty() ? "nothing" : args->items[0]->describe());
      stack_.push_back(args->items[0]);
    } else {
      check(false, at, "REDUCE calls ", name);
    }
  }

  // BINPERSID with ('storage', torch.<Type>Storage, key, location, numel).
  void persistent_load(size_t at) {
    check(static_cast<bool>(load_storage_), at, "a persistent id (a torch.save storage) in a plain pickle");
    Value id = pop(at);
    check(id->kind == PickleValue::Kind::kTuple && id->items.size() == 5, at, "a persistent id that is ",
          id->describe());
    const auto& items = id->items;
    check(items[0]->kind == PickleValue::Kind::kString && items[0]->text == "storage", at,
          "a persistent id that is not a storage");
    c10::ScalarType type = c10::ScalarType::Undefined;  // set by storage_dtype, or check throws
    check(items[1]->kind == PickleValue::Kind::kGlobal && storage_dtype(items[1]->text, &type), at,
          "a storage of type ", items[1]->describe());
    check(items[2]->kind == PickleValue::Kind::kString, at, "a storage key that is ", items[2]->describe());
    const int64_t numel = integer(items[4], at, "a storage's size");
    check(numel >= 0 && numel < (int64_t{1} << 40), at, "a storage of ", numel, " elements");
    const std::string& key = items[2]->text;
    auto cached = storages_.find(key);
    if (cached == storages_.end()) {
      Value storage = make(PickleValue::Kind::kStorage);
      storage->tensor = load_storage_(key, type, numel);
      cached = storages_.emplace(key, storage).first;
    }
    check(cached->second->tensor.scalar_type() == type && cached->second->tensor.numel() == numel, at, "storage ",
          key, " is used with two types or sizes");
    stack_.push_back(cached->second);
  }

  // The stream's framing: PROTO and FRAME.
  bool protocol_op(uint8_t op, size_t at) {
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t version = byte();
        check(version <= 5, at, "pickle protocol ", int(version));
        return true;
      }
      case 0x95: little(8); return true;  // FRAME: a size hint
      default:
        return false;
    }
  }
  // Marks and the empty or closed containers: MARK, EMPTY_DICT, EMPTY_LIST, tuples.
  bool container_op(uint8_t op, size_t at) {
    switch (op) {
      case '(': marks_.push_back(stack_.size()); return true;
      case '}': stack_.push_back(make(PickleValue::Kind::kDict)); return true;
      case ']': stack_.push_back(make(PickleValue::Kind::kList)); return true;
      case ')': stack_.push_back(tuple({})); return true;
      case 't': stack_.push_back(tuple(pop_mark(at))); return true;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        std::vector<Value> items(static_cast<size_t>(op - 0x84));
        for (size_t i = items.size(); i > 0; --i) items[i - 1] = pop(at);
        stack_.push_back(tuple(std::move(items)));
        return true;
      }
      default:
        return false;
    }
  }
  // The scalars: None, booleans, integers, floats, strings and bytes.
  bool scalar_op(uint8_t op, size_t at) {
    switch (op) {
      case 'N': stack_.push_back(make(PickleValue::Kind::kNone)); return true;
      case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
        Value value = make(PickleValue::Kind::kBool);
        value->boolean = op == 0x88;
        stack_.push_back(value);
        return true;
      }
      case 'K': case 'M': case 'J': {  // BININT1, BININT2, BININT
        Value value = make(PickleValue::Kind::kInt);
        const int width = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        const uint64_t raw = little(width);
        value->integer = width == 4 ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw);
        stack_.push_back(value);
        return true;
      }
      case 0x8a: {  // LONG1: a little-endian two's complement of n bytes
        const uint8_t n = byte();
        check(n <= 8, at, "an integer of ", int(n), " bytes");
        uint64_t raw = little(n);
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);
        Value value = make(PickleValue::Kind::kInt);
        value->integer = static_cast<int64_t>(raw);
        stack_.push_back(value);
        return true;
      }
      case 'G': {  // BINFLOAT, big-endian
        uint64_t raw = 0;
        for (int i = 0; i < 8; ++i) raw = (raw << 8) | byte();
        Value value = make(PickleValue::Kind::kFloat);
        std::memcpy(&value->real, &raw, sizeof(raw));
        stack_.push_back(value);
        return true;
      }
      case 'X': case 0x8c: case 0x8d: case 'C': case 'B': case 0x8e: {
        // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, SHORT_BINBYTES, BINBYTES, BINBYTES8
        const bool text = op == 'X' || op == 0x8c || op == 0x8d;
        const int width = (op == 0x8c || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
        Value value = make(text ? PickleValue::Kind::kString : PickleValue::Kind::kBytes);
        value->text = bytes(little(width));
        stack_.push_back(value);
        return true;
      }
      default:
        return false;
    }
  }
  // The memo: PUT, GET and MEMOIZE.
  bool memo_op(uint8_t op, size_t at) {
    switch (op) {
      case 'q': memo_put(byte(), at); return true;        // BINPUT
      case 'r': memo_put(little(4), at); return true;     // LONG_BINPUT
      case 0x94: memo_put(memo_.size(), at); return true;  // MEMOIZE
      case 'h': memo_get(byte(), at); return true;        // BINGET
      case 'j': memo_get(little(4), at); return true;     // LONG_BINGET
      default:
        return false;
    }
  }
  // Classes and what is built from them: GLOBAL, STACK_GLOBAL, NEWOBJ, REDUCE, PERSID.
  bool object_op(uint8_t op, size_t at) {
    switch (op) {
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module = line();
        global(module, line());
        return true;
      }
      case 0x93: {  // STACK_GLOBAL
        Value name = pop(at);
        Value module = pop(at);
        check(module->kind == PickleValue::Kind::kString && name->kind == PickleValue::Kind::kString, at,
              "STACK_GLOBAL of ", module->describe(), " and ", name->describe());
        global(module->text, name->text);
        return true;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), opaque
        Value args = pop(at);
        Value cls = pop(at);
        check(cls->kind == PickleValue::Kind::kGlobal && args->kind == PickleValue::Kind::kTuple, at, "NEWOBJ of ",
              cls->describe());
        stack_.push_back(object_of(cls->text, args));
        return true;
      }
      case 'R': reduce(at); return true;
      case 'Q': persistent_load(at); return true;
      default:
        return false;
    }
  }
  // What fills or drops what is on the stack: SETITEM(S), APPEND(S), BUILD, POP.
  bool filling_op(uint8_t op, size_t at) {
    switch (op) {
      case 's': {  // SETITEM
        Value value = pop(at);
        Value key = pop(at);
        set_items(top(at), {key, value}, at);
        return true;
      }
      case 'u': {  // SETITEMS
        std::vector<Value> values = pop_mark(at);
        set_items(top(at), values, at);
        return true;
      }
      case 'a': {  // APPEND
        Value value = pop(at);
        Value list = top(at);
        check(list->kind == PickleValue::Kind::kList || list->kind == PickleValue::Kind::kObject, at, "APPEND to ",
              list->describe());
        list->items.push_back(value);
        return true;
      }
      case 'e': {  // APPENDS
        std::vector<Value> values = pop_mark(at);
        Value list = top(at);
        check(list->kind == PickleValue::Kind::kList || list->kind == PickleValue::Kind::kObject, at, "APPENDS to ",
              list->describe());
        list->items.insert(list->items.end(), values.begin(), values.end());
        return true;
      }
      case 'b': {  // BUILD: an OrderedDict's attributes (state_dict()._metadata, dropped), an object's state
        Value state = pop(at);
        Value built = top(at);
        check(built->kind == PickleValue::Kind::kDict || built->kind == PickleValue::Kind::kObject, at, "BUILD on ",
              built->describe());
        if (built->kind == PickleValue::Kind::kObject) built->state = state;
        return true;
      }
      case '0': pop(at); return true;  // POP
      default:
        return false;
    }
  }

  void step(uint8_t op, size_t at) {
    if (protocol_op(op, at) || container_op(op, at) || scalar_op(op, at) || memo_op(op, at) || object_op(op, at) ||
        filling_op(op, at)) {
      return;
    }
    check(false, at, "pickle opcode 0x", std::hex, int(op), std::dec, " (not one a state dict's pickle uses)");
  }

  const std::string& data_;
  const StorageLoader& load_storage_;
  const std::string& source_;
  size_t pos_ = 0;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::vector<Value> memo_;
  std::map<std::string, Value> storages_;
  std::vector<std::unique_ptr<PickleValue>>& arena_;
};

bool is_tensor_dict(const PickleValue& value) {
  if (value.kind != PickleValue::Kind::kDict) return false;
  for (const auto& [key, item] : value.entries) {
    if (key->kind != PickleValue::Kind::kString || item->kind != PickleValue::Kind::kTensor) return false;
  }
  return true;
}

}  // namespace

std::string PickleValue::describe() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "a bool";
    case Kind::kInt: return "an int";
    case Kind::kFloat: return "a float";
    case Kind::kString: return "a string";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return str_cat("a tuple of ", items.size());
    case Kind::kList: return str_cat("a list of ", items.size());
    case Kind::kDict: return str_cat("a dict of ", entries.size(), " entries");
    case Kind::kTensor: return str_cat("a tensor ", tensor.scalar_type(), " ", tensor.sizes());
    case Kind::kGlobal: return text;
    case Kind::kStorage: return str_cat("a storage of ", tensor.numel(), " ", tensor.scalar_type());
    case Kind::kObject: return str_cat("a ", text, " object");
  }
  return "?";
}

Unpickled unpickle_torch_save(const std::string& pickle, const StorageLoader& load_storage, const std::string& source) {
  Unpickled result;
  result.root = Machine(pickle, load_storage, source, result.arena).run();
  return result;
}

Unpickled unpickle_plain(const std::string& pickle, const std::string& source) {
  return unpickle_torch_save(pickle, StorageLoader(), source);
}

std::map<std::string, torch::Tensor> find_state_dict(const PickleValue& root, const std::string& source) {
  const PickleValue* found = is_tensor_dict(root) ? &root : nullptr;
  if (found == nullptr && root.kind == PickleValue::Kind::kDict) {
    for (const char* name : {"state_dict", "model", "model_state_dict", "module"}) {
      for (const auto& [key, item] : root.entries) {
        if (found == nullptr && key->kind == PickleValue::Kind::kString && key->text == name && is_tensor_dict(*item)) {
          found = item;
        }
      }
    }
  }
  if (found == nullptr) {
    std::string holds = root.describe();
    if (root.kind == PickleValue::Kind::kDict) {
      holds += ":";
      size_t shown = 0;
      for (const auto& [key, item] : root.entries) {
        if (++shown > 12) {
          holds += " ...";
          break;
        }
        holds += key->kind == PickleValue::Kind::kString ? str_cat(" '", key->text, "'") : str_cat(" ", key->describe());
        holds += str_cat(" (", item->describe(), ")");
      }
    }
    std::string why;
    if (root.kind == PickleValue::Kind::kObject) {
      why = root.text.rfind("__torch__", 0) == 0
                ? " (a TorchScript module: train it with model: {type: TorchScriptModel, path: ...})"
                : " (a pickled Python object, such as torch.save(model): save model.state_dict() instead)";
    }
    LOCKSTEP_FAIL(source, ": no state dict in it: it holds ", holds, why,
                  "; lockstep reads a dict of tensors (torch.save(model.state_dict(), path)), or one under "
                  "'state_dict', 'model', 'model_state_dict' or 'module'");
  }
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [key, item] : found->entries) {
    LOCKSTEP_CHECK(weights.emplace(key->text, item->tensor).second, source, ": the state dict has key '", key->text,
                   "' twice");
  }
  return weights;
}

}  // namespace lockstep
