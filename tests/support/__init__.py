"""What the tests share: the pipeline harness, sample data, fault hooks, local servers and
brokers, and the helpers that poll, scrape and compare. No test module imports another."""
