//! Weight blob container: the byte layout of ane-runtime.md §4 and a reader that rejects
//! every corrupted header field.

use anelm_mil::{
    BlobData, BlobError, DType, FunctionBuilder, Opset, Program, TensorType, WeightFiles, f16, read_blob,
    write_fp16_blob, write_int8_blob,
};

fn sample() -> Vec<u8> {
    write_fp16_blob(&[0.5f32, 1.0, -1.0, 2.0, 3.0, 4.0].map(f16::from_f32)).unwrap()
}

/// Field table of ane-runtime.md §4, byte by byte.
#[test]
fn field_table() {
    let b = sample();
    assert_eq!(b.len(), 128 + 12);
    let nonzero: Vec<(usize, u8)> = b[..128]
        .iter()
        .enumerate()
        .filter(|(_, v)| **v != 0)
        .map(|(i, v)| (i, *v))
        .collect();
    assert_eq!(
        nonzero,
        vec![
            (0, 0x01),
            (4, 0x02),
            (64, 0xEF),
            (65, 0xBE),
            (66, 0xAD),
            (67, 0xDE),
            (68, 0x01),
            (72, 12),
            (80, 128)
        ]
    );
    assert_eq!(u32::from_le_bytes([b[64], b[65], b[66], b[67]]), 0xDEAD_BEEF);
}

#[test]
fn every_header_byte_is_validated() {
    let good = sample();
    for i in 0..128 {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            assert!(read_blob(&bad).is_err(), "byte {i} ^ {flip:#x} accepted");
        }
    }
}

#[test]
fn named_field_errors() {
    let good = sample();
    let set = |at: usize, v: u32| {
        let mut b = good.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        read_blob(&b).unwrap_err()
    };
    let field = |e: BlobError| match e {
        BlobError::BadField { field, offset, .. } => (field, offset),
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(field(set(0, 3)), ("file header word 0", 0));
    assert_eq!(field(set(4, 1)), ("file header word 1", 4));
    assert_eq!(field(set(64, 0xDEAD_BEEE)), ("chunk magic", 64));
    assert_eq!(field(set(68, 0)), ("chunk header word 1", 68));
    assert_eq!(field(set(80, 64)), ("chunk payload offset", 80));
    assert!(matches!(
        set(72, 10),
        BlobError::SizeMismatch {
            declared: 10,
            available: 12
        }
    ));
    assert!(matches!(set(72, u32::MAX), BlobError::SizeMismatch { .. }));
    assert!(matches!(set(76, 1), BlobError::NonZeroReserved { offset: 76, .. }));
    assert!(matches!(set(100, 7), BlobError::NonZeroReserved { offset: 100, .. }));
    // The MX benchmarks' "byte 10 of the chunk = 0x08" variant (ane-hardware.md §2.3) is refused.
    let mut mx = good.clone();
    mx[72..84].fill(0);
    mx[74] = 0x08;
    assert!(read_blob(&mx).is_err());
}

#[test]
fn truncated_and_extended_files_are_refused() {
    let good = sample();
    for n in 0..good.len() {
        assert!(read_blob(&good[..n]).is_err(), "truncated to {n} accepted");
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(read_blob(&long), Err(BlobError::SizeMismatch { .. })));
    // int8: odd payload, pad byte must be present and zero.
    let b = write_int8_blob(&[1, 2, 3]).unwrap();
    assert!(read_blob(&b[..b.len() - 1]).is_err());
    let mut nz = b.clone();
    *nz.last_mut().unwrap() = 1;
    assert!(matches!(read_blob(&nz), Err(BlobError::NonZeroReserved { .. })));
}

#[test]
fn payload_must_match_declared_tensor() {
    let b = sample();
    let r = read_blob(&b).unwrap();
    assert!(r.decode(&TensorType::fp16([2, 3, 1, 1])).is_ok());
    assert!(matches!(
        r.decode(&TensorType::fp16([2, 2, 1, 1])),
        Err(BlobError::PayloadMismatch { .. })
    ));
    assert!(matches!(
        r.decode(&TensorType::new(DType::Int8, [12])),
        Ok(BlobData::Int8(_))
    ));
    assert!(matches!(
        r.decode(&TensorType::new(DType::Fp32, [3])),
        Err(BlobError::UnsupportedDType(_))
    ));
    assert!(r.decode(&TensorType::fp16([usize::MAX, 2])).is_err());
}

#[test]
fn weight_files_resolve_a_program() {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let x = f.input("x", TensorType::surface(4, 32)).unwrap();
    let q = f
        .blob(
            "Wq",
            TensorType::new(DType::Int8, [2, 4, 1, 1]),
            "@model_path/weights/wq.bin",
        )
        .unwrap();
    let s = f
        .blob("Ws", TensorType::fp16([2, 1, 1, 1]), "@model_path/weights/ws.bin")
        .unwrap();
    let w = f.constexpr_blockwise_shift_scale("W", &q, &s).unwrap();
    let y = f.linear("y", &x, &w).unwrap();
    f.output(&y).unwrap();
    let p = Program::new(vec![f.finish().unwrap()]);

    let mut files = WeightFiles::new();
    assert_eq!(
        files.resolve_program(&p),
        Err(BlobError::MissingFile("@model_path/weights/wq.bin".into()))
    );
    files
        .insert_int8("@model_path/weights/wq.bin", &[1, -2, 3, -4, 5, -6, 7, -8])
        .unwrap();
    files
        .insert_fp16("@model_path/weights/ws.bin", &[f16::from_f32(0.5), f16::from_f32(0.25)])
        .unwrap();
    let got = files.resolve_program(&p).unwrap();
    assert_eq!(
        got[0],
        ("Wq".to_string(), BlobData::Int8(vec![1, -2, 3, -4, 5, -6, 7, -8]))
    );
    assert_eq!(got[1].0, "Ws");
    assert_eq!(files.len(), 2);
    assert_eq!(files.total_bytes(), (128 + 8) + (128 + 4));

    // Wrong-size payload for the declared type.
    files
        .insert_fp16("@model_path/weights/ws.bin", &[f16::from_f32(0.5)])
        .unwrap();
    assert!(matches!(
        files.resolve_program(&p),
        Err(BlobError::PayloadMismatch { .. })
    ));

    // Offsets other than the chunk header at 64 are refused.
    let text = p
        .to_string()
        .replace("offset = tensor<uint64, []>(64)", "offset = tensor<uint64, []>(192)");
    let p2 = anelm_mil::parse_program(&text).unwrap();
    assert_eq!(files.resolve_program(&p2), Err(BlobError::BadOffset(192)));
}
