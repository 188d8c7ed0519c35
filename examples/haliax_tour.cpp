#include <haliax/haliax.hpp>
int main() { return 0; }
