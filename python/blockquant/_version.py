"""The package's version, in a module of its own: the command line and the ONNX writer read it
without importing the package's ``__init__`` (which reaches every other module)."""

__version__ = "0.1.0"
