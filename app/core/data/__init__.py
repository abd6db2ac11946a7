"""Rating data: the in-memory ratings structure, splits, synthetic generators and public data set loaders."""
