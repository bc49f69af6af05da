//! Minimal reader for the .npy files of the conformance vectors (little-endian f32 / i64,
//! C order, version 1 header). Test support only.
#![allow(dead_code)]

use std::path::Path;

pub struct Npy {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub i64: Vec<i64>,
}

pub fn read(path: &Path) -> Npy {
    let b = std::fs::read(path)
        .unwrap_or_else(|e| panic!("missing conformance file {}: {e}", path.display()));
    assert_eq!(
        &b[..6],
        b"\x93NUMPY",
        "{} is not a .npy file",
        path.display()
    );
    let (hlen, start) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"));
    let shape_s = &header[header.find("'shape': (").unwrap() + 10..];
    let shape: Vec<usize> = shape_s[..shape_s.find(')').unwrap()]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data = &b[start + hlen..];
    let mut out = Npy {
        shape,
        f32: vec![],
        i64: vec![],
    };
    if header.contains("'<f4'") {
        out.f32 = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
    } else if header.contains("'<i8'") {
        out.i64 = data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
    } else {
        panic!("unsupported dtype in {}: {header}", path.display());
    }
    out
}
