"""The windowing semantics, pure Python and free of Spark: one key's state (`key_state`), its
reference run record by record (`key_windows`), the same for many keys at once on columns
(`columnar_windows`), and closing a key's windows when its config is gone (`closing`)."""
