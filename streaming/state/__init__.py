"""The stateful stage: `applyInPandasWithState` over hash buckets of keys, each bucket's state,
summaries of its keys, and the union rows it emits for the sink."""
