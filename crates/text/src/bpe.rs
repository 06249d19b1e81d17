//! Byte-level BPE and its pre-tokenizers.
