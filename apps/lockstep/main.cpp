#include <iostream>
int main() { std::cout << "lockstep\n"; return 0; }
