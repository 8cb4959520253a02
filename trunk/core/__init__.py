"""The ground floor every other package builds on, importing none of them (torch, tokenizers and
safetensors only): the codec and its special ids, checkpoint reading, atomic writes, entity-tag schemes and
the flag a Ctrl+C leaves (``interrupts``)."""
