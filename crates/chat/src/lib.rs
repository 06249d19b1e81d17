//! Chat templates, think control and the reasoning/answer split.
