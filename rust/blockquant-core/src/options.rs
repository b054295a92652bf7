//! The quantize options ([`QuantizeOptions`]) and their names, parsed here and nowhere else: the
//! binding turns a Python string into an option through [`OptionName::from_name`], and the
//! error lists the choices.

use crate::calibrate::Calibration;
use crate::codec::Rounding;
use crate::error::{QuantError, Result};
use crate::scale::ScaleRounding;

/// An option spelled by a fixed set of names.
pub trait OptionName: Copy + 'static {
    /// The option's name, as a keyword argument (`calibration`).
    const WHAT: &'static str;
    /// Every spelling and what it means, in the order the documentation lists them.
    const NAMES: &'static [(&'static str, Self)];

    /// The option `name` spells; an unknown name is [`QuantError::Option`] listing the choices.
    fn from_name(name: &str) -> Result<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
            .ok_or_else(|| {
                let names: Vec<String> =
                    Self::NAMES.iter().map(|(n, _)| format!("'{n}'")).collect();
                QuantError::Option(format!(
                    "{} must be one of ({}), got '{name}'",
                    Self::WHAT,
                    names.join(", ")
                ))
            })
    }
}

impl OptionName for Calibration {
    const WHAT: &'static str = "calibration";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("minmax", Self::MinMax),
        ("absmean", Self::AbsMean),
        ("mse", Self::Mse),
    ];
}

impl OptionName for Rounding {
    const WHAT: &'static str = "rounding";
    const NAMES: &'static [(&'static str, Self)] =
        &[("half_away", Self::HalfAway), ("half_even", Self::HalfEven)];
}

impl OptionName for ScaleRounding {
    const WHAT: &'static str = "scale_rounding";
    const NAMES: &'static [(&'static str, Self)] = &[
        ("up", Self::Up),
        ("nearest", Self::Nearest),
        ("mx", Self::Mx),
    ];
}

/// Options of a quantize call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizeOptions {
    pub calibration: Calibration,
    pub rounding: Rounding,
    pub scale_rounding: ScaleRounding,
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
