"""cortiq_drv: the cortiq engine's CUDA arm on the raw CUDA driver, with a numpy host arm.

Nothing happens at import: no driver initialisation, no environment reads, no directories created.
"""

__version__ = "0.1.0"
