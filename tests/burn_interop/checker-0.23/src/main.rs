//! burn-interop-checker built against burn 0.23.0-pre.1: the program is the burn 0.22.1
//! checker's `src/checker.rs`, one folder up; only how burn-store hands a tensor over differs.

#[path = "../../src/checker.rs"]
mod checker;

use std::process::ExitCode;

use burn_core::tensor::TensorData;
use burn_store::StoreTensor;

/// burn-store 0.23's `BurnpackStore` hands out `StoreTensor`s, which keep their source.
impl checker::Stored for StoreTensor {
    fn dims(&self) -> Vec<usize> {
        self.shape().to_vec()
    }

    fn data(&self) -> Result<TensorData, String> {
        self.to_data().map_err(|e| e.to_string())
    }
}

fn main() -> ExitCode {
    checker::run("0.23.0-pre.1")
}
