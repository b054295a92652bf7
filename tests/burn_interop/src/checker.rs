//! Reads a burn-pack (`.bpk`) file the way a burn program does and prints what burn makes
//! of every tensor in it, one JSON object per line, so `tests/test_burn_interop.py` can compare
//! burn's reconstruction with blockquant's bit for bit.
//!
//! ```text
//! burn-interop-checker FILE.bpk
//! ```
//!
//! Each tensor goes through `BurnpackStore` (burn-store), `Tensor::from_data` on the flex CPU
//! backend and, for a quantized dtype, `dequantize`. Lines:
//!
//! - `{"name", "shape", "dtype": "qfloat", "f32": [u32 bit patterns, row-major]}`: a quantized
//!   tensor, dequantized to f32;
//! - `{"name", "shape", "dtype": "f32" | "i64" | ..., "hex": "..."}`: a plain tensor, its bytes
//!   after a trip through the backend (`into_data`), little-endian;
//! - `{"name", "error": "..."}`: burn refused the tensor (a panic or an error, message kept).
//!
//! A tensor named `weight` of rank 2 is also loaded into a module parameter through
//! `ModuleSnapshot::load_from`, the path a model takes, and reported as `module.weight`.
//!
//! ```text
//! burn-interop-checker --write-samples DIR
//! ```
//!
//! writes, with burn-pack's own `Writer`, `DIR/sample.bpk` (plain and quantized tensors and a
//! metadata entry, the file `blockquant.burnpack.save_burnpack` must reproduce byte for byte)
//! and `DIR/sample_extras.bpk` (the same plus a `param_id` and typed scalars, which blockquant
//! reads and ignores).
//!
//! Exit status: 0 when the file was read (even if some tensors were refused), 2 when the file
//! itself was refused or a sample could not be written, 64 on bad arguments.
//!
//! One source for every burn version the interop test checks against: this module, shared by
//! the crate beside it (burn 0.22.1, `src/main.rs`) and `checker-0.23/` (burn 0.23.0-pre.1, its
//! binary named `burn-interop-checker-0-23`), whose `main.rs` each say how their burn-store
//! hands a stored tensor over ([`Stored`]).

// The `Module` derive expands to `burn::...` paths, resolved from this module.
use burn_core as burn;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use burn_core::module::{Module, Param};
use burn_core::tensor::quantization::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
use burn_core::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_store::burn_pack::{Scalar, Writer};
use burn_store::{BurnpackStore, ModuleSnapshot, ModuleStore, bridge};

/// What a tensor turned into, before it is written out as JSON.
enum Loaded {
    /// Dequantized values, as f32 bit patterns.
    Dequantized(Vec<u32>),
    /// A plain tensor's bytes after `from_data` / `into_data`.
    Plain(DType, Vec<u8>),
}

#[derive(Module, Debug)]
struct Holder {
    weight: Param<Tensor<2>>,
}

/// What the checker needs of a tensor `BurnpackStore::get_all_tensors` hands out: burn-pack's
/// `Tensor` in burn 0.22.1, burn-store's `StoreTensor` in 0.23. Each crate's `main.rs` implements
/// it for its version's type.
pub trait Stored {
    /// The tensor's shape, as stored.
    fn dims(&self) -> Vec<usize>;
    /// The tensor's `TensorData`, read from the file.
    fn data(&self) -> Result<TensorData, String>;
}

/// The committed samples' `producer` metadata, whichever burn writes them: every checker must
/// write the same bytes.
const SAMPLE_PRODUCER: &str = "burn 0.22.1";

/// The whole program; `burn` names the version it is built against, for the usage line.
pub fn run(burn: &str) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [flag, dir] if flag == "--write-samples" => {
            return match write_samples(std::path::Path::new(dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("cannot write the samples: {e}");
                    ExitCode::from(2)
                }
            };
        }
        [path] => path,
        _ => {
            eprintln!("usage: burn-interop-checker FILE.bpk | --write-samples DIR (burn {burn})");
            return ExitCode::from(64);
        }
    };
    // A refused tensor is reported on stdout with its panic message; the default hook would
    // also print a backtrace notice on stderr for every one of them.
    std::panic::set_hook(Box::new(|_| {}));
    let device = Device::flex();

    let mut store = BurnpackStore::from_file(path).auto_extension(false);
    let tensors = match store.get_all_tensors() {
        Ok(tensors) => tensors.clone(),
        Err(e) => {
            println!("{{\"file_error\": {}}}", json_str(&e.to_string()));
            return ExitCode::from(2);
        }
    };

    for (name, tensor) in &tensors {
        let shape: Vec<usize> = tensor.dims();
        let result = catch_unwind(AssertUnwindSafe(|| {
            tensor.data().and_then(|data| load(data, &device))
        }));
        println!("{}", json_line(name, &shape, flatten(result)));
    }

    if let Some(weight) = tensors.get("weight")
        && weight.dims().len() == 2
    {
        let shape: Vec<usize> = weight.dims();
        let result = catch_unwind(AssertUnwindSafe(|| load_into_module(path, &shape, &device)));
        println!("{}", json_line("module.weight", &shape, flatten(result)));
    }
    ExitCode::SUCCESS
}

/// The tensors of the samples, in the order burn-pack lays out their data (not name order, so
/// the sample also pins that descriptors are sorted while data follows the writer's order).
fn sample_tensors() -> Vec<(&'static str, TensorData)> {
    let f32s: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    // format.md "The byte layout"'s example: 8 Q8F values, two UE4M3 block scales, an f32 per-tensor scale.
    let two_level = QuantScheme::default()
        .with_value(QuantValue::Q8F)
        .with_store(QuantStore::Native)
        .per_block([4], ScaleDtype::UE4M3)
        .per_tensor(ScaleDtype::F32);
    // No level at all: burn's implicit f32 per-tensor scale, a different dtype from an
    // explicit `per_tensor(F32)`.
    let no_level = QuantScheme::default()
        .with_value(QuantValue::Q8S)
        .with_store(QuantStore::Native);
    let per_tensor_f16 = no_level.per_tensor(ScaleDtype::F16);
    let block_2d = no_level.per_block([2, 2], ScaleDtype::BF16);
    vec![
        (
            "w_two_level",
            TensorData::quantized(
                vec![0i8, 25, 51, 76, 102, 127, -128, -1],
                [8],
                two_level,
                &[0.5, 0.125],
                Some(3.0),
            ),
        ),
        ("b_f32", TensorData::new(f32s, [2, 3])),
        (
            "q_no_level",
            TensorData::quantized(
                vec![0i8, 25, -51, 127, -127, 1],
                [2, 3],
                no_level,
                &[0.25],
                None,
            ),
        ),
        ("i_i64", TensorData::new(vec![-3i64, 0, 7, i64::MAX], [4])),
        ("m_bool", TensorData::new(vec![true, false, true], [3])),
        (
            "q_f16",
            TensorData::quantized(vec![1i8, -2, 3], [3], per_tensor_f16, &[0.5], None),
        ),
        (
            "q_block_2d",
            TensorData::quantized(
                (0..12i8).collect::<Vec<_>>(),
                [3, 4],
                block_2d,
                &[1.0, 2.0, 0.5, 4.0],
                None,
            ),
        ),
        ("u_u8", TensorData::new(vec![0u8, 255, 9], [3])),
        ("e_empty", TensorData::new(Vec::<f32>::new(), [0, 2])),
    ]
}

fn write_samples(dir: &std::path::Path) -> Result<(), String> {
    let pack =
        |name: &str, data: TensorData, param_id| bridge::from_data(data, name.into(), param_id);
    let plain: Vec<_> = sample_tensors()
        .into_iter()
        .map(|(n, d)| pack(n, d, None))
        .collect();
    let bytes = Writer::new(plain)
        .with_metadata("producer", SAMPLE_PRODUCER)
        .with_metadata("format", "sample")
        .into_bytes()
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("sample.bpk"), &*bytes).map_err(|e| e.to_string())?;

    let extras: Vec<_> = sample_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (n, d))| pack(n, d, Some(1000 + i as u64)))
        .collect();
    let bytes = Writer::new(extras)
        .with_metadata("producer", SAMPLE_PRODUCER)
        .with_scalar("epoch", Scalar::UInt(12))
        .with_scalar("delta", Scalar::Int(-3))
        .with_scalar("lr", Scalar::Float(0.1))
        .with_scalar("half", Scalar::Float(0.5))
        .with_scalar("done", Scalar::Bool(true))
        .into_bytes()
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("sample_extras.bpk"), &*bytes).map_err(|e| e.to_string())
}

/// Builds the tensor on the flex backend and reads it back (dequantized if quantized).
fn load(data: TensorData, device: &Device) -> Result<Loaded, String> {
    let dtype = data.dtype();
    macro_rules! by_rank {
        ($rank:expr, $body:ident) => {
            match $rank {
                0 => $body::<0>(data, device),
                1 => $body::<1>(data, device),
                2 => $body::<2>(data, device),
                3 => $body::<3>(data, device),
                4 => $body::<4>(data, device),
                5 => $body::<5>(data, device),
                6 => $body::<6>(data, device),
                7 => $body::<7>(data, device),
                8 => $body::<8>(data, device),
                rank => Err(format!("rank {rank} is outside the checker's 1..=8")),
            }
        };
    }
    let rank = data.shape().len();
    match dtype {
        DType::QFloat(_) => by_rank!(rank, dequantized),
        DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {
            by_rank!(rank, plain_float)
        }
        DType::Bool(_) => by_rank!(rank, plain_bool),
        _ => by_rank!(rank, plain_int),
    }
}

fn dequantized<const D: usize>(data: TensorData, device: &Device) -> Result<Loaded, String> {
    let out = Tensor::<D>::from_data(data, device)
        .dequantize()
        .into_data();
    f32_bits(out)
}

fn plain_float<const D: usize>(data: TensorData, device: &Device) -> Result<Loaded, String> {
    let dtype = data.dtype();
    let out = Tensor::<D>::from_data(data, (device, dtype)).into_data();
    Ok(Loaded::Plain(out.dtype(), out.as_bytes().to_vec()))
}

fn plain_int<const D: usize>(data: TensorData, device: &Device) -> Result<Loaded, String> {
    let dtype = data.dtype();
    let out = Tensor::<D, Int>::from_data(data, (device, dtype)).into_data();
    Ok(Loaded::Plain(out.dtype(), out.as_bytes().to_vec()))
}

fn plain_bool<const D: usize>(data: TensorData, device: &Device) -> Result<Loaded, String> {
    let out = Tensor::<D, Bool>::from_data(data, device).into_data();
    Ok(Loaded::Plain(out.dtype(), out.as_bytes().to_vec()))
}

/// The path a model takes: a module parameter of the right shape, filled by the store.
fn load_into_module(path: &str, shape: &[usize], device: &Device) -> Result<Loaded, String> {
    let zeros = Tensor::<2>::zeros([shape[0], shape[1]], device);
    let mut holder = Holder {
        weight: Param::from_tensor(zeros),
    };
    let mut store = BurnpackStore::from_file(path)
        .auto_extension(false)
        .allow_partial(true);
    let result = holder.load_from(&mut store).map_err(|e| e.to_string())?;
    if !result.errors.is_empty() {
        return Err(format!("{:?}", result.errors));
    }
    f32_bits(holder.weight.val().dequantize().into_data())
}

fn f32_bits(data: TensorData) -> Result<Loaded, String> {
    let values: Vec<f32> = data
        .convert_dtype(DType::F32)
        .try_into_vec::<f32>()
        .map_err(|e| format!("{e:?}"))?;
    Ok(Loaded::Dequantized(
        values.iter().map(|v| v.to_bits()).collect(),
    ))
}

fn flatten(result: std::thread::Result<Result<Loaded, String>>) -> Result<Loaded, String> {
    result.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        Err(format!("panic: {message}"))
    })
}

fn json_line(name: &str, shape: &[usize], loaded: Result<Loaded, String>) -> String {
    let head = format!(
        "{{\"name\": {}, \"shape\": {:?}",
        json_str(name),
        shape.iter().collect::<Vec<_>>()
    );
    match loaded {
        Ok(Loaded::Dequantized(bits)) => {
            format!("{head}, \"dtype\": \"qfloat\", \"f32\": {bits:?}}}")
        }
        Ok(Loaded::Plain(dtype, bytes)) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!(
                "{head}, \"dtype\": {}, \"hex\": \"{hex}\"}}",
                json_str(dtype.name())
            )
        }
        Err(message) => format!("{head}, \"error\": {}}}", json_str(&message)),
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
