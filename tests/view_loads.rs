//! `View::load_row` of contiguous f16 / bf16 rows (vectorised conversion) is bit-identical
//! to `half`'s per-element conversion, for every 16-bit pattern (NaN payloads included),
//! at every row length and offset the 8-wide loop and its tail can see.

use half::{bf16, f16};
use kvevict::View;

/// Every row of `view` (`[1, rows, d]`, the 16-bit patterns `bits`) loads as `to_f32` of
/// each pattern, bit for bit.
fn rows_convert_bit_exactly(
    name: &str,
    view: &View,
    bits: &[u16],
    d: usize,
    to_f32: fn(u16) -> f32,
) {
    let mut out = vec![0f32; d];
    for t in 0..bits.len() / d {
        view.load_row(0, t, &mut out);
        for c in 0..d {
            let x = bits[t * d + c];
            assert_eq!(
                out[c].to_bits(),
                to_f32(x).to_bits(),
                "{name} bits {x:#06x}"
            );
        }
    }
}

#[test]
fn f16_and_bf16_rows_convert_bit_exactly() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for d in [1usize, 7, 8, 13, 64, 128, 1024] {
        let rows = all.len() / d;
        let bits = &all[..rows * d];
        let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
        let vh = View::f16(&h, [1, rows, d], [rows * d, d, 1]).unwrap();
        let vb = View::bf16(&b, [1, rows, d], [rows * d, d, 1]).unwrap();
        rows_convert_bit_exactly("f16", &vh, bits, d, |x| f16::from_bits(x).to_f32());
        rows_convert_bit_exactly("bf16", &vb, bits, d, |x| bf16::from_bits(x).to_f32());
    }
}
