"""The benchmarks behind BENCHMARKS.md: the commands of bench/ and `make soak` (hack/soak.py) are thin entry
points to the modules here, which tests/bench checks without a cluster or a clock."""
