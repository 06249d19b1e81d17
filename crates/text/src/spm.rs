//! SentencePiece-style tokenization (score-driven merges, byte fallback).
