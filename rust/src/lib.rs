//! `rlmesh._core`: the per-lane, per-step bookkeeping of an evaluation run.
//!
//! Mirrors the pure-Python core `python/rlmesh/_pycore/` file for file: `seeding`, `args`,
//! `digests` (each episode's determinism evidence), `ledger`, `assembly`, `resize`,
//! `rotations`, `actions`, `chunks`, `ensembles` (temporal ensembling), `telemetry`, `rounds` (the per-lane work of a round, and
//! the synchronous loop of rounds on top of the others), and the
//! wire part in its own folder, `wire/`: `wire::served` (a served env's steps and episode
//! tallies) and `wire::transport` (a raw-bytes gRPC transport on tonic). The Python core is the
//! specification; the parity tests keep the two in lockstep.

use pyo3::prelude::*;

pub mod actions;
pub mod args;
pub mod assembly;
pub mod chunks;
pub mod digests;
pub mod ensembles;
pub mod ledger;
pub mod resize;
pub mod rotations;
pub mod rounds;
pub mod seeding;
pub mod telemetry;
pub mod wire;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(seeding::episode_seed, m)?)?;
    m.add_function(wrap_pyfunction!(digests::value_digest, m)?)?;
    m.add_class::<assembly::ObservationAssembler>()?;
    m.add_class::<ledger::EpisodeStarts>()?;
    m.add_class::<ledger::EpisodeSummary>()?;
    m.add_function(wrap_pyfunction!(chunks::split_chunk, m)?)?;
    m.add_class::<chunks::ChunkQueues>()?;
    m.add_class::<ensembles::TemporalEnsembles>()?;
    m.add_class::<actions::ActionApplier>()?;
    m.add_class::<telemetry::LatencyStats>()?;
    m.add_class::<rounds::RoundRunner>()?;
    wire::register(m)?;
    Ok(())
}
