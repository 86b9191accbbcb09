"""GPU benchmarks (run on an H100/H200 through the device tool); results under bench/results/."""
