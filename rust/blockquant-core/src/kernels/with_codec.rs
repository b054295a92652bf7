//! [`with_codec!`]: a scheme's value (or codebook) and rounding to the encoder type its kernels
//! are monomorphized for. The names it expands to (`QuantValue`, `minifloat`, `LookupCode`,
//! `E2M1Code`, `FloatCode`, `IntHalfAway`, `IntHalfEven`, `Rounding`) are the caller's imports.

/// Evaluates `$body` with `$codec` bound to the encoder of `$scheme`'s value (or codebook) under
/// `$rounding`: each (value, rounding) pair gets its own monomorphized kernel.
macro_rules! with_codec {
    ($scheme:expr, $rounding:expr, |$codec:ident| $body:expr) => {{
        let scheme: &crate::scheme::QuantScheme = $scheme;
        let value: QuantValue = scheme.value;
        let (qmin, qmax) = value.range();
        match (minifloat(value), $rounding) {
            _ if scheme.codebook.is_some() => {
                let $codec = LookupCode::new(scheme.codebook.as_ref().expect("checked"));
                $body
            }
            (Some(_), _) if value == QuantValue::E2M1 => {
                let $codec = E2M1Code;
                $body
            }
            (Some(fmt), _) => {
                let $codec = FloatCode(fmt);
                $body
            }
            (None, Rounding::HalfAway) => {
                let $codec = IntHalfAway { qmin, qmax };
                $body
            }
            (None, Rounding::HalfEven) => {
                let $codec = IntHalfEven { qmin, qmax };
                $body
            }
        }
    }};
}

pub(crate) use with_codec;
