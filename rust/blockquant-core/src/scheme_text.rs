//! The scheme's printed forms, in one place: the canonical text (format.md "The scheme text form"), which
//! [`parse`] reads back, and the `Display` form (`QuantScheme(value=…)`), which error messages
//! and the Python `repr` show.
//!
//! Only the canonical spelling parses, so `parse(t)?.text().to_string() == t` for every `t`
//! that parses. The grammar knows no preset names (the Python `presets.resolve` does). Messages
//! quote texts as Python's `repr` does, so they read the same as the Python API's own.

use std::fmt;
use std::str::FromStr;

use crate::error::{QuantError, Result};
use crate::lookup::{Codebook, NAMED};
use crate::scheme::{
    BlockScale, Offset, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype,
};

/// Longer than any scheme text: the longest, a codebook of 16 entries of the longest float32
/// text each, is about 300 characters.
pub const MAX_SCHEME_TEXT: usize = 1000;

const LEVELS_HINT: &str =
    "tensor, tensor:DTYPE, blockN:DTYPE, blockNxM:DTYPE or blockN:DTYPE+tensor:f32";

/// The scheme a canonical text names; a bad text is a [`QuantError::Scheme`] quoting the part
/// that is wrong.
///
/// # Examples
/// ```
/// use blockquant_core::scheme_text::parse;
/// let s = parse("e2m1/packed_native0/block16:ue4m3+tensor:f32").unwrap();
/// assert!(s.is_two_level());
/// assert_eq!(s.text().to_string(), "e2m1/packed_native0/block16:ue4m3+tensor:f32");
/// ```
pub fn parse(text: &str) -> Result<QuantScheme> {
    let n = text.chars().count();
    if n > MAX_SCHEME_TEXT {
        let head: String = text.chars().take(40).collect();
        return Err(err(format!(
            "a scheme text of {n} characters is too long to be one (at most {MAX_SCHEME_TEXT}): {}...",
            quote(&head)
        )));
    }
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() == 1 {
        return Err(err(format!(
            "unknown scheme {}: a scheme text is VALUE/STORE/LEVELS such as \
             'q4s/packed_u32_0/block32:f16' (preset names: blockquant.presets.resolve; blockquant presets lists them)",
            quote(text)
        )));
    }
    if !(3..=4).contains(&parts.len()) {
        return Err(err(format!(
            "a scheme is VALUE/STORE/LEVELS[/lookup:CODEBOOK | /zero:u8 | /bias:DTYPE], got {} parts in {}",
            parts.len(),
            quote(text)
        )));
    }
    let value = parse_value(parts[0], text)?;
    let store = parse_store(parts[1], text)?;
    let (tensor, block) = parse_levels(parts[2], text)?;
    let (entries, offset) = match parts.get(3) {
        Some(part) if part.starts_with("zero") || part.starts_with("bias") => {
            (None, Some(parse_offset(part, text)?))
        }
        Some(part) => (Some(parse_lookup(part, text)?), None),
        None => (None, None),
    };
    build(value, store, tensor, block, entries, offset).map_err(|e| in_text(e, text))
}

/// An affine scheme's offset part: `zero:u8` or `bias:DTYPE` (f32, f16, bf16).
fn parse_offset(part: &str, text: &str) -> Result<Offset> {
    if part == "zero:u8" {
        return Ok(Offset::Zero);
    }
    if let Some(d) = part.strip_prefix("bias:") {
        let dtype = parse_dtype(d, text)?;
        return Ok(Offset::Bias(dtype));
    }
    Err(err(format!(
        "unknown offset {} in {}: expected 'zero:u8' or 'bias:DTYPE' (f32, f16, bf16)",
        quote(part),
        quote(text)
    )))
}

impl FromStr for QuantScheme {
    type Err = QuantError;

    fn from_str(text: &str) -> Result<Self> {
        parse(text)
    }
}

/// The scheme of parsed parts, checked by the scheme's own rules.
fn build(
    value: QuantValue,
    store: QuantStore,
    tensor: Option<ScaleDtype>,
    block: Option<BlockScale>,
    entries: Option<Vec<f32>>,
    offset: Option<Offset>,
) -> Result<QuantScheme> {
    let mut scheme = QuantScheme {
        value,
        store,
        tensor,
        block,
        offset,
        ..QuantScheme::default()
    };
    if let Some(values) = entries {
        scheme = scheme.with_codebook(Codebook::for_value(&values, value)?);
    }
    scheme.validate()?;
    Ok(scheme)
}

fn err(msg: String) -> QuantError {
    QuantError::Scheme(msg)
}

/// A rule's message, said of the text it broke.
fn in_text(e: QuantError, text: &str) -> QuantError {
    err(format!("{e} (in {})", quote(text)))
}

/// "a, b or c".
fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn value_text(v: QuantValue) -> String {
    v.name().to_ascii_lowercase()
}

fn dtype_text(d: ScaleDtype) -> String {
    d.name().to_ascii_lowercase()
}

fn parse_value(part: &str, text: &str) -> Result<QuantValue> {
    QuantValue::EVERY
        .into_iter()
        .find(|v| value_text(*v) == part)
        .ok_or_else(|| {
            let names: Vec<String> = QuantValue::EVERY.into_iter().map(value_text).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            err(format!(
                "unknown value {} in {}: expected {}",
                quote(part),
                quote(text),
                one_of(&names)
            ))
        })
}

fn parse_dtype(part: &str, text: &str) -> Result<ScaleDtype> {
    ScaleDtype::ALL
        .into_iter()
        .find(|d| dtype_text(*d) == part)
        .ok_or_else(|| {
            let names: Vec<String> = ScaleDtype::ALL.into_iter().map(dtype_text).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            err(format!(
                "unknown scale dtype {} in {}: expected {}",
                quote(part),
                quote(text),
                one_of(&names)
            ))
        })
}

/// A canonical number: no sign, no leading zero, at most 20 digits (any u64 fits in 20).
fn is_number(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 20
        && b.iter().all(u8::is_ascii_digit)
        && (b[0] != b'0' || b.len() == 1)
}

/// A canonical number as a size: past `usize` it is the message a too large size gets.
fn size(digits: &str, what: &str) -> Result<usize> {
    digits.parse::<usize>().map_err(|_| {
        err(format!(
            "{what} must be at most {}, got {digits}",
            usize::MAX
        ))
    })
}

fn parse_store(part: &str, text: &str) -> Result<QuantStore> {
    if part == "native" {
        return Ok(QuantStore::Native);
    }
    // The dim follows the name; an underscore keeps it apart from the 32 of u32.
    if let Some(d) = part.strip_prefix("packed_u32_").filter(|d| is_number(d)) {
        return Ok(QuantStore::PackedU32(size(d, "a packing dim")?));
    }
    if let Some(d) = part.strip_prefix("packed_native").filter(|d| is_number(d)) {
        return Ok(QuantStore::PackedNative(size(d, "a packing dim")?));
    }
    Err(err(format!(
        "unknown store {} in {}: expected native, packed_u32_DIM or packed_nativeDIM, DIM \
         counting from the last axis (packed_u32_0, packed_native0)",
        quote(part),
        quote(text)
    )))
}

fn parse_block(part: &str, text: &str) -> Result<BlockScale> {
    let Some((head, dtype)) = part.split_once(':') else {
        return Err(err(format!(
            "block level {} in {} has no scale dtype: write e.g. '{part}:f16'",
            quote(part),
            quote(text)
        )));
    };
    let dims: Vec<&str> = head["block".len()..].split('x').collect();
    if !dims.iter().all(|d| is_number(d)) {
        return Err(err(format!(
            "bad block size {} in {}: expected positive sizes joined by 'x', e.g. block32 or \
             block16x16",
            quote(head),
            quote(text)
        )));
    }
    let sizes = || -> Result<Vec<usize>> { dims.iter().map(|d| size(d, "a block size")).collect() };
    if dims.len() > 1 && dims[0] == "1" {
        // The spelling to write instead: the block as the scheme keeps it, leading 1s dropped.
        let canon = BlockScale::new(&sizes()?, ScaleDtype::F32)?;
        let canon: Vec<String> = canon.size().iter().map(usize::to_string).collect();
        return Err(err(format!(
            "block size {} in {} has a leading 1: a block is rank-relative, write {}",
            quote(head),
            quote(text),
            quote(&format!("block{}", canon.join("x")))
        )));
    }
    let dtype = parse_dtype(dtype, text)?;
    sizes()
        .and_then(|s| BlockScale::new(&s, dtype))
        .map_err(|e| in_text(e, text))
}

fn parse_levels(part: &str, text: &str) -> Result<(Option<ScaleDtype>, Option<BlockScale>)> {
    if part == "tensor" {
        return Ok((None, None));
    }
    if let Some(dtype) = part.strip_prefix("tensor:") {
        if dtype.contains('+') {
            return Err(err(format!(
                "levels {} in {}: write the block level first, as blockN:DTYPE+tensor:f32",
                quote(part),
                quote(text)
            )));
        }
        return Ok((Some(parse_dtype(dtype, text)?), None));
    }
    if part.starts_with("block") {
        let (block_part, second) = match part.split_once('+') {
            Some((b, t)) => (b, Some(t)),
            None => (part, None),
        };
        let block = parse_block(block_part, text)?;
        let Some(second) = second else {
            return Ok((None, Some(block)));
        };
        let Some(dtype) = second.strip_prefix("tensor:") else {
            return Err(err(format!(
                "bad second level {} in {}: a two-level scheme ends with '+tensor:f32'",
                quote(second),
                quote(text)
            )));
        };
        return Ok((Some(parse_dtype(dtype, text)?), Some(block)));
    }
    Err(err(format!(
        "unknown levels {} in {}: expected {LEVELS_HINT}",
        quote(part),
        quote(text)
    )))
}

fn codebook_names() -> String {
    let names: Vec<&str> = NAMED.iter().map(|(n, _)| *n).collect();
    one_of(&names)
}

/// The codebook's entries: a named one's, or a list each entry of which is in canonical form.
fn parse_lookup(part: &str, text: &str) -> Result<Vec<f32>> {
    if part == "lookup" {
        return Err(err(format!(
            "Lookup mode needs a codebook in {}: write lookup:NAME ({}) or lookup:[V,V,...]",
            quote(text),
            codebook_names()
        )));
    }
    let Some(body) = part.strip_prefix("lookup:") else {
        return Err(err(format!(
            "unknown mode {} in {}: the only mode written is 'lookup:CODEBOOK' (symmetric is the \
             default and is not written)",
            quote(part),
            quote(text)
        )));
    };
    if let Some((_, values)) = NAMED.iter().find(|(n, _)| *n == body) {
        return Ok(values.to_vec());
    }
    let Some(list) = body.strip_prefix('[').and_then(|b| b.strip_suffix(']')) else {
        return Err(err(format!(
            "unknown codebook {} in {}: expected {} or [V,V,...]",
            quote(body),
            quote(text),
            codebook_names()
        )));
    };
    let mut values = Vec::new();
    for tok in list.split(',') {
        let Some(v) = read_python_float(tok) else {
            return Err(err(format!(
                "bad codebook entry {} in {}: not a number",
                quote(tok),
                quote(text)
            )));
        };
        // Through f64 and then f32, as Python's float() and numpy's float32() round it.
        let v = v as f32;
        let canon = float32_text(v);
        if canon != tok {
            return Err(err(format!(
                "codebook entry {} in {} is not in canonical form: write {} (the shortest text \
                 of its float32)",
                quote(tok),
                quote(text),
                quote(&canon)
            )));
        }
        values.push(v);
    }
    let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
    if let Some((name, _)) = NAMED
        .iter()
        .find(|(_, named)| named.iter().map(|v| v.to_bits()).eq(bits.iter().copied()))
    {
        return Err(err(format!(
            "the codebook in {} is the named one {}: write lookup:{name}",
            quote(text),
            quote(name)
        )));
    }
    Ok(values)
}

/// What Python's `float(tok)` reads: surrounding whitespace ignored, and single underscores
/// between digits; `None` where it raises.
fn read_python_float(tok: &str) -> Option<f64> {
    let t = tok.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c));
    if !t.contains('_') {
        return t.parse().ok();
    }
    let b = t.as_bytes();
    let between_digits = |i: usize| {
        i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_digit() && b[i + 1].is_ascii_digit()
    };
    if (0..b.len()).any(|i| b[i] == b'_' && !between_digits(i)) {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// A float32 as numpy's `str(np.float32(v))` writes it (the codebook entries of the text):
/// its shortest round-trip digits, positional for 1e-4 <= |v| < 1e6 (`0.25`, `100.0`) and zero,
/// scientific elsewhere with a signed exponent of two digits or more (`1e-08`, `1e+06`,
/// `3.4028235e+38`; the float32 nearest 1e-4 is below it: `1e-04`); `nan`, `inf`, `-inf`.
pub fn float32_text(v: f32) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sign = if v.is_sign_negative() { "-" } else { "" };
    if v == 0.0 {
        return format!("{sign}0.0");
    }
    let (digits, exp) = shortest_digits(v.abs());
    let a = v.abs() as f64;
    if (1e-4..1e6).contains(&a) {
        let point = exp + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        return format!("{sign}{text}");
    }
    let exp_sign = if exp < 0 { '-' } else { '+' };
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
}

/// The shortest digits that read back as `a` (> 0, finite) and the decimal exponent of the
/// first, as numpy's Dragon4 chooses them: Rust's shortest (`{:e}`), except that where two
/// candidates are equally near `a` numpy takes the one ending in an even digit.
fn shortest_digits(a: f32) -> (String, i32) {
    let split = |sci: &str| -> (String, i32) {
        let (mantissa, exp) = sci.split_once('e').expect("`{:e}` writes an exponent");
        let digits = mantissa.chars().filter(|c| *c != '.').collect();
        (
            digits,
            exp.parse().expect("`{:e}` writes an integer exponent"),
        )
    };
    let (digits, exp) = split(&format!("{a:e}"));
    // Every f32 is exact in 112 significant digits.
    let (exact, exact_exp) = split(&format!("{a:.120e}"));
    let n = digits.len();
    let tie = exact_exp == exp
        && exact.as_bytes()[n] == b'5'
        && exact.as_bytes()[n + 1..].iter().all(|d| *d == b'0');
    if !tie {
        return (digits, exp);
    }
    let reads_back = |d: &str| {
        let text = format!("{}.{}e{exp}", &d[..1], &d[1..]);
        text.parse::<f32>() == Ok(a)
    };
    let below = exact[..n].to_string();
    let above = increment(&below);
    for other in [Some(below), above].into_iter().flatten() {
        let even = other.as_bytes()[n - 1] % 2 == 0;
        if other != digits && even && reads_back(&other) {
            return (other, exp);
        }
    }
    (digits, exp)
}

/// A string of decimal digits plus one in its last place; `None` when that carries past the
/// first digit.
fn increment(digits: &str) -> Option<String> {
    let mut d = digits.as_bytes().to_vec();
    for i in (0..d.len()).rev() {
        if d[i] == b'9' {
            d[i] = b'0';
        } else {
            d[i] += 1;
            return String::from_utf8(d).ok();
        }
    }
    None
}

/// `s` as Python's `repr` quotes a str: in single quotes unless it holds a `'` and no `"`, with
/// backslash escapes for the quote, backslashes and characters that do not print.
pub fn quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if prints(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(q);
    out
}

/// Whether Python's `repr` shows `c` as it is: not a control, format, separator (but the
/// space), private-use or noncharacter code point. (Python also escapes unassigned code points,
/// which Rust's std cannot name; a scheme text holding one is refused all the same.)
fn prints(c: char) -> bool {
    let u = c as u32;
    let format = matches!(u,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF
        | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F);
    let private = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let nonchar = matches!(u, 0xFDD0..=0xFDEF) || u & 0xFFFE == 0xFFFE;
    c == ' ' || !(c.is_control() || c.is_whitespace() || format || private || nonchar)
}

// -- printing ----------------------------------------------------------------------------------

/// A scheme's canonical text, which [`parse`] reads back: see [`QuantScheme::text`].
#[derive(Debug, Clone, Copy)]
pub struct SchemeText<'a>(&'a QuantScheme);

impl QuantScheme {
    /// The canonical text form (`q4s/packed_u32_0/block32:f16`), which [`parse`] reads back.
    pub fn text(&self) -> SchemeText<'_> {
        SchemeText(self)
    }
}

impl fmt::Display for SchemeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        f.write_str(&value_text(s.value))?;
        match s.store {
            QuantStore::Native => f.write_str("/native/")?,
            QuantStore::PackedU32(d) => write!(f, "/packed_u32_{d}/")?,
            QuantStore::PackedNative(d) => write!(f, "/packed_native{d}/")?,
        }
        match (s.block, s.tensor) {
            (None, None) => f.write_str("tensor")?,
            (None, Some(t)) => write!(f, "tensor:{}", dtype_text(t))?,
            (Some(b), tensor) => {
                let dims: Vec<String> = b.size().iter().map(usize::to_string).collect();
                write!(f, "block{}:{}", dims.join("x"), dtype_text(b.dtype))?;
                if let Some(t) = tensor {
                    write!(f, "+tensor:{}", dtype_text(t))?;
                }
            }
        }
        match s.offset {
            Some(Offset::Zero) => f.write_str("/zero:u8")?,
            Some(Offset::Bias(d)) => write!(f, "/bias:{}", dtype_text(d))?,
            None => {}
        }
        match s.codebook {
            Some(cb) => write!(f, "/lookup:{}", CodebookText(&cb)),
            None => Ok(()),
        }
    }
}

/// A codebook as both printed forms write it: its name, or `[v0,v1,...]` in float32 text.
struct CodebookText<'a>(&'a Codebook);

impl fmt::Display for CodebookText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.0.name() {
            return f.write_str(name);
        }
        let vals: Vec<String> = self.0.entries().into_iter().map(float32_text).collect();
        write!(f, "[{}]", vals.join(","))
    }
}

// The `Display` form, which is also the Python `repr`: `QuantScheme(value=Q8F, ...)`.

impl fmt::Display for QuantValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for ScaleDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for QuantStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native => f.write_str("Native"),
            Self::PackedU32(d) => write!(f, "PackedU32({d})"),
            Self::PackedNative(d) => write!(f, "PackedNative({d})"),
        }
    }
}

impl fmt::Display for BlockScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.size().iter().map(|d| d.to_string()).collect();
        write!(f, "BlockScale([{}], {})", dims.join(", "), self.dtype)
    }
}

impl fmt::Display for QuantScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QuantScheme(value={}, store={}", self.value, self.store)?;
        if self.mode == QuantMode::Lookup {
            f.write_str(", mode=Lookup")?;
        }
        if let Some(cb) = &self.codebook {
            write!(f, ", codebook={}", CodebookText(cb))?;
        }
        if let Some(b) = &self.block {
            write!(f, ", block={b}")?;
        }
        if let Some(t) = self.tensor {
            write!(f, ", tensor={t}")?;
        }
        match self.offset {
            Some(Offset::Zero) => f.write_str(", offset=Zero(U8)")?,
            Some(Offset::Bias(d)) => write!(f, ", offset=Bias({d})")?,
            None => {}
        }
        f.write_str(")")
    }
}

#[cfg(test)]
#[path = "scheme_text_tests.rs"]
mod tests;
