"""ornith-stack: deploy the Ornith models with DFlash speculative decoding on real GPU hosts."""

__version__ = "0.1.0"
