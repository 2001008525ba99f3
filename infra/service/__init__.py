"""`tenant-windows serve`: the query service's HTTP API, its metrics and its console page."""
