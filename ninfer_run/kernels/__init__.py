"""Custom kernels, each beside its pure-torch reference; built lazily on CUDA machines only."""
