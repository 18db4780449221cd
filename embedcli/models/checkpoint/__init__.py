"""Reading a checkpoint folder: resolve and download, sentence-transformers config, weights files, remote code."""
