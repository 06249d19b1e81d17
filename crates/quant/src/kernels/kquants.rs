use super::Kernels;

pub(super) fn register(_k: &mut Kernels) {}
