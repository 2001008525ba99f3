"""`tenant-windows`: the command line, one module per command group."""
