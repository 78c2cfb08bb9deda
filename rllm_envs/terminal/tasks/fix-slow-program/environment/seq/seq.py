"""seq.py N: print the N-th Fibonacci number (fib(0) = 0, fib(1) = 1)."""
import sys


def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


if __name__ == "__main__":
    print(fib(int(sys.argv[1])))
