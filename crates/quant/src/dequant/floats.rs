//! Plain element types: IEEE floats, bfloat16 and integers (block size 1).

use super::{f16_at, u16_at, u32_at};

pub(super) fn f32_block(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_bits(u32_at(b, 0));
}

pub(super) fn f16_block(b: &[u8], y: &mut [f32]) {
    y[0] = f16_at(b, 0);
}

/// bfloat16 is the high half of an f32: widening is a shift, NaN payloads included.
pub(super) fn bf16_block(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_bits(u32::from(u16_at(b, 0)) << 16);
}

/// f64 rounded to nearest-even f32.
pub(super) fn f64_block(b: &[u8], y: &mut [f32]) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    y[0] = f64::from_le_bytes(a) as f32;
}

pub(super) fn i8_block(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from(b[0] as i8);
}

pub(super) fn i16_block(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from(u16_at(b, 0) as i16);
}

/// i32 rounded to nearest-even f32.
pub(super) fn i32_block(b: &[u8], y: &mut [f32]) {
    y[0] = u32_at(b, 0) as i32 as f32;
}

/// i64 rounded to nearest-even f32.
pub(super) fn i64_block(b: &[u8], y: &mut [f32]) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    y[0] = i64::from_le_bytes(a) as f32;
}
