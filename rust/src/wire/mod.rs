//! The wire part of the core: what a served env and the gRPC transport do per message.
//! `served` steps a served env's lanes and keeps its episode tallies; `transport` is the
//! raw-bytes gRPC transport on tonic (channels, bidi streams and a generic server).
//!
//! Mirrors `python/rlmesh/_pycore/wire/` file for file. `register` adds this part's classes to
//! `rlmesh._core`, under the same names the Python core's `wire` package exports.

use pyo3::prelude::*;

pub mod served;
pub mod transport;

/// Adds the served env's classes and the transport's classes and error to the module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<served::ServedEpisodes>()?;
    m.add_class::<served::ServedSteps>()?;
    transport::register(m)
}
