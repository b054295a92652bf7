use super::*;

/// More than any address space holds, yet a valid size (under isize::MAX bytes).
const HUGE: usize = (isize::MAX as usize) / 8;

#[test]
fn helpers_make_what_the_infallible_calls_make() {
    assert_eq!(try_zeroed::<f32>(5).unwrap(), vec![0.0f32; 5]);
    assert_eq!(try_zeroed::<u8>(0).unwrap(), Vec::<u8>::new());
    assert_eq!(try_vec(3, 7u16).unwrap(), vec![7u16; 3]);
    assert_eq!(try_to_vec(&[1, 2, 3]).unwrap(), vec![1, 2, 3]);
    assert_eq!(
        try_collect((0..4).map(|i| i * 2)).unwrap(),
        vec![0, 2, 4, 6]
    );
    let par = try_par_collect((0..10_000usize).into_par_iter().map(|i| i + 1)).unwrap();
    assert_eq!(par, (1..=10_000).collect::<Vec<_>>());
    assert_eq!(par.capacity(), 10_000, "no second allocation");
    assert_eq!(try_with_capacity::<f64>(9).unwrap().capacity(), 9);
}

#[test]
fn an_allocation_that_cannot_be_had_is_out_of_memory() {
    let bytes = HUGE * 4;
    assert_eq!(
        try_zeroed::<f32>(HUGE),
        Err(QuantError::OutOfMemory { bytes })
    );
    assert_eq!(
        try_vec(HUGE, 1.0f32),
        Err(QuantError::OutOfMemory { bytes })
    );
    assert_eq!(
        try_with_capacity::<u32>(HUGE),
        Err(QuantError::OutOfMemory { bytes })
    );
    assert_eq!(
        try_par_collect((0..HUGE).into_par_iter().map(|i| i as f32)),
        Err(QuantError::OutOfMemory { bytes })
    );
    // A size past usize: the byte count saturates, the message still reads.
    let e = try_zeroed::<f64>(usize::MAX).unwrap_err();
    assert_eq!(e, QuantError::OutOfMemory { bytes: usize::MAX });
    assert_eq!(
        e.to_string(),
        format!("out of memory: could not allocate {} bytes", usize::MAX)
    );
}
