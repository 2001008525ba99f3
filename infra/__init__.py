"""What a deployment runs besides the product packages: the CLI and the config reference.

Everything only a laptop or a test needs (local broker, S3 server, load generator, demo,
benchmarks) is in `infra.dev`, which the wheel does not ship.
"""
