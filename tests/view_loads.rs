//! `View::load_row` of contiguous f16 / bf16 rows (vectorised conversion) is bit-identical
//! to `half`'s per-element conversion, for every 16-bit pattern (NaN payloads included),
//! at every row length and offset the 8-wide loop and its tail can see.

use half::{bf16, f16};
use kvevict::View;

#[test]
fn f16_and_bf16_rows_convert_bit_exactly() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for d in [1usize, 7, 8, 13, 64, 128, 1024] {
        let rows = all.len() / d;
        let h: Vec<f16> = all[..rows * d].iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = all[..rows * d]
            .iter()
            .map(|&b| bf16::from_bits(b))
            .collect();
        let vh = View::f16(&h, [1, rows, d], [rows * d, d, 1]).unwrap();
        let vb = View::bf16(&b, [1, rows, d], [rows * d, d, 1]).unwrap();
        let mut out = vec![0f32; d];
        for t in 0..rows {
            vh.load_row(0, t, &mut out);
            for c in 0..d {
                let want = h[t * d + c].to_f32().to_bits();
                assert_eq!(
                    out[c].to_bits(),
                    want,
                    "f16 bits {:#06x}",
                    h[t * d + c].to_bits()
                );
            }
            vb.load_row(0, t, &mut out);
            for c in 0..d {
                let want = b[t * d + c].to_f32().to_bits();
                assert_eq!(
                    out[c].to_bits(),
                    want,
                    "bf16 bits {:#06x}",
                    b[t * d + c].to_bits()
                );
            }
        }
    }
}
