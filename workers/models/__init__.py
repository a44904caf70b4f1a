"""Model files: the models-dir catalog (torch-free) and model families (zimage/)."""
