//! The one owner of a run's episode lifecycle: episodes started, rounds run, episodes finished.
//!
//! Mirrors `python/rlmesh/_pycore/rounds.py` name for name; that file is the specification
//! (the lifecycle, the phases of a round, when `run_rounds` stops, the messages). Here the
//! runner owns the run's ledger, assembler, applier and queues by value and calls their Rust
//! methods directly, with lanes as slices: within a round, the only per-lane Python work left
//! is what is inherent (indexing the lane's action, calling its env's `step`, reading the
//! step's result). Each lane's step count and clock live in the ledger alone, and each lane's
//! running digests in its `LaneDigests` (`digests`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArray};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PySlice, PyString, PyTuple};
use pyo3::{Borrowed, PyClass};

use crate::actions::ActionApplier;
use crate::args::{i64_arg, lanes_arg, path_text, vector, Dtype};
use crate::assembly::{numpy, ObservationAssembler};
use crate::chunks::{chunk_leaves, ChunkQueues};
use crate::digests::LaneDigests;
use crate::ensembles::TemporalEnsembles;
use crate::ledger::{EpisodeStarts, EpisodeSummary, LaneState, Overflow, RouteLedger};
use crate::telemetry::LatencyStats;

pyo3::import_exception!(rlmesh.errors, EnvError);
pyo3::import_exception!(rlmesh.errors, LaneFailures);
pyo3::import_exception!(rlmesh.errors, RlmeshError);

const NS_PER_S: f64 = 1e9;

type Int64Array<'py> = Bound<'py, PyArray1<i64>>;
/// What `begin_round` returns: `(running, predict_lanes, payload)`.
type Opened<'py> = (Int64Array<'py>, Int64Array<'py>, Bound<'py, PyAny>);
/// What `end_round` returns: `(ended, truncated)`.
type Closed<'py> = (Int64Array<'py>, Bound<'py, PyArray1<bool>>);
/// What `run_rounds` returns: `(ended, infos, rounds, lane_steps)`.
type Ran<'py> = (Int64Array<'py>, Bound<'py, PyList>, u64, u64);
/// What `finish` returns: `(summaries, episode_ids, model_ends)`.
type Finished<'py> = (Vec<EpisodeSummary>, Int64Array<'py>, Int64Array<'py>);
/// What `lane_episodes` returns: `(indices, seeds, steps)`.
type LaneEpisodes<'py> = (Int64Array<'py>, Vec<Option<u64>>, Int64Array<'py>);

/// A batch of actions indexed by lane position, as `lane_actions` returns it.
pub(crate) enum LaneActions<'py> {
    /// An array (or any sequence) indexed as it is: `actions[k]`.
    Batch(Bound<'py, PyAny>),
    /// One object per lane: the per-lane dicts or tuples of a dict or tuple batch.
    PerLane(Vec<Bound<'py, PyAny>>),
}

impl<'py> LaneActions<'py> {
    pub(crate) fn get(&self, k: usize) -> PyResult<Bound<'py, PyAny>> {
        match self {
            LaneActions::Batch(actions) => actions.get_item(k),
            LaneActions::PerLane(actions) => Ok(actions[k].clone()),
        }
    }
}

/// `actions` batched along a leading lane axis, as something indexed by lane position.
///
/// An array stays as it is (indexing it yields a lane's row, a numpy scalar for a 1-D batch,
/// as Gymnasium's own vectors pass them); a dict (any mapping) or tuple of batches becomes
/// `count` per-lane dicts or tuples. A `ValueError` names a leaf without `count` rows along its leading axis.
pub(crate) fn lane_actions<'py>(
    actions: &Bound<'py, PyAny>,
    count: usize,
    path: &mut Vec<String>,
) -> PyResult<LaneActions<'py>> {
    let py = actions.py();
    if let Ok(array) = actions.cast::<PyUntypedArray>() {
        // The usual batch, neither a mapping nor a tuple: skip the `Mapping` ABC check.
        return Ok(LaneActions::Batch(batch_of(array.as_any(), count, path)?));
    }
    if let Ok(mapping) = actions.cast::<PyMapping>() {
        let mut columns = Vec::new();
        for item in mapping.items()?.iter() {
            let (key, leaf): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item.extract()?;
            path.push(key.str()?.to_string());
            let column = lane_actions(&leaf, count, path);
            path.pop();
            columns.push((key, column?));
        }
        let per_lane = (0..count)
            .map(|k| {
                let dict = PyDict::new(py);
                for (key, column) in &columns {
                    dict.set_item(key, column.get(k)?)?;
                }
                Ok(dict.into_any())
            })
            .collect::<PyResult<_>>()?;
        return Ok(LaneActions::PerLane(per_lane));
    }
    if let Ok(tuple) = actions.cast::<PyTuple>() {
        let mut parts = Vec::with_capacity(tuple.len());
        for (i, leaf) in tuple.iter().enumerate() {
            path.push(i.to_string());
            let part = lane_actions(&leaf, count, path);
            path.pop();
            parts.push(part?);
        }
        let per_lane = (0..count)
            .map(|k| {
                let items = parts
                    .iter()
                    .map(|part| part.get(k))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyTuple::new(py, items)?.into_any())
            })
            .collect::<PyResult<_>>()?;
        return Ok(LaneActions::PerLane(per_lane));
    }
    Ok(LaneActions::Batch(batch_of(actions, count, path)?))
}

/// `actions` itself, refused unless it holds `count` rows along its leading axis.
fn batch_of<'py>(
    actions: &Bound<'py, PyAny>,
    count: usize,
    path: &[String],
) -> PyResult<Bound<'py, PyAny>> {
    let py = actions.py();
    let rows = match actions.len() {
        Ok(rows) => Some(rows),
        Err(err) if err.is_instance_of::<PyTypeError>(py) => None,
        Err(err) => return Err(err),
    };
    if rows != Some(count) {
        let found = rows.map_or_else(|| "no lane axis".to_owned(), |rows| rows.to_string());
        return Err(PyValueError::new_err(format!(
            "{} must hold one action per lane stepped ({count}) along its leading axis, got \
             {found}",
            path_text(py, "actions", path)?
        )));
    }
    Ok(actions.clone())
}

/// The `EnvError` for an env's `method` that raised `err` on `lane`, with `err` as its cause.
pub(crate) fn env_failure(
    py: Python<'_>,
    env_name: &Bound<'_, PyAny>,
    method: &str,
    err: PyErr,
    lane: Option<i64>,
) -> PyResult<PyErr> {
    let place = match lane {
        None => env_name.str()?.to_string(),
        Some(lane) => format!("lane {lane} ({})", env_name.str()?),
    };
    let failure = EnvError::new_err(format!(
        "{place}: {method}() raised {}: {}",
        err.get_type(py).name()?,
        err.value(py).str()?
    ));
    failure.set_cause(py, Some(err));
    Ok(failure)
}

/// How an error names a lane's episode at a step: `lane 2 (episode index 7, step 12)`, or
/// `lane 2 (surplus episode, step 12)` for an episode that is never scored (index -1). `step`
/// is the steps the episode took before the action in question (0: its first action).
fn lane_text(lane: i64, index: i64, step: i64) -> String {
    if index < 0 {
        return format!("lane {lane} (surplus episode, step {step})");
    }
    format!("lane {lane} (episode index {index}, step {step})")
}

/// How the applier names row `k` of an output for `lanes` with `kept` rows per lane (its next
/// `kept` actions): the lane, its episode's index and the step of that row's action. Called
/// only on the way to an error.
fn row_text<'a>(
    ledger: &'a RouteLedger,
    lanes: &'a [i64],
    kept: usize,
) -> impl Fn(usize) -> String + 'a {
    move |row| {
        let lane = lanes[row / kept];
        let step = ledger.lane_steps(lane as usize) + (row % kept) as i64;
        lane_text(lane, ledger.lane_index(lane as usize), step)
    }
}

/// A one-item argument tuple that `run_rounds` calls a per-lane function with, round after
/// round: under the stable ABI of Python 3.10 this crate builds for, `call1` makes (and frees)
/// a new tuple on every call. A callee that keeps its argument tuple keeps that one; the next
/// call gets a new tuple.
struct OneArg<'py> {
    tuple: RefCell<Bound<'py, PyTuple>>,
}

impl<'py> OneArg<'py> {
    fn new(py: Python<'py>) -> PyResult<Self> {
        Ok(OneArg {
            tuple: RefCell::new(PyTuple::new(py, [py.None()])?),
        })
    }

    /// `function(arg)`.
    fn call(
        &self,
        function: &Bound<'py, PyAny>,
        arg: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = function.py();
        let tuple = {
            let mut tuple = self.tuple.borrow_mut();
            // SAFETY: the reference count of a live tuple, read under the GIL.
            if unsafe { ffi::Py_REFCNT(tuple.as_ptr()) } != 1 {
                *tuple = PyTuple::new(py, [py.None()])?;
            }
            // SAFETY: nobody else references the tuple (checked above), so it may be changed
            // in place; PyTuple_SetItem takes the reference `into_ptr` hands over and releases
            // the item it replaces.
            if unsafe { ffi::PyTuple_SetItem(tuple.as_ptr(), 0, arg.clone().into_ptr()) } != 0 {
                return Err(PyErr::fetch(py));
            }
            tuple.clone()
        };
        // SAFETY: PyObject_Call returns a new reference, or null with an exception set.
        unsafe {
            let result =
                ffi::PyObject_Call(function.as_ptr(), tuple.as_ptr(), std::ptr::null_mut());
            Bound::from_owned_ptr_or_err(py, result)
        }
    }
}

/// The run's model as `run_rounds` calls it: `rlmesh.model.ModelHandler`'s `predict_now`,
/// `lane_corner`, `combine` and `failure`, looked up once per call of `run_rounds`.
struct ModelCalls<'py> {
    predict_now: Bound<'py, PyAny>,
    lane_corner: Option<Bound<'py, PyAny>>,
    wants_episode_ids: bool,
    /// A prediction for P lanes is P calls of a per-lane corner (optional, default false).
    calls_per_lane: bool,
    combine: Bound<'py, PyAny>,
    failure: Bound<'py, PyAny>,
    /// What the per-lane corner is called with.
    lane_arg: OneArg<'py>,
}

impl<'py> ModelCalls<'py> {
    fn new(model: &Bound<'py, PyAny>) -> PyResult<Self> {
        let lane_corner = model.getattr("lane_corner")?;
        Ok(ModelCalls {
            predict_now: model.getattr("predict_now")?,
            lane_corner: (!lane_corner.is_none()).then_some(lane_corner),
            wants_episode_ids: model.getattr("wants_episode_ids")?.is_truthy()?,
            calls_per_lane: match model.getattr_opt("calls_per_lane")? {
                Some(value) => value.is_truthy()?,
                None => false,
            },
            combine: model.getattr("combine")?,
            failure: model.getattr("failure")?,
            lane_arg: OneArg::new(model.py())?,
        })
    }

    /// The model's output for the `count` lanes of `input` (`episode_ids`: theirs, when the
    /// model wants them); an error it raises becomes what `failure(error, rounds)` returns,
    /// the error chained.
    fn predict(
        &self,
        input: Input<'py>,
        count: usize,
        episode_ids: Option<Vec<i64>>,
        rounds: u64,
    ) -> PyResult<Output<'py>> {
        let py = self.failure.py();
        let called = match (input, &self.lane_corner, episode_ids) {
            (Input::Rows(rows), Some(corner), None) => self.per_lane(corner, rows),
            (input, _, Some(ids)) => self
                .predict_now
                .call1((input.into_batch(py)?, count, PyArray1::from_vec(py, ids)))
                .map(Output::Batch),
            (Input::Batch(payload), Some(corner), None)
                if payload.is_instance_of::<PyUntypedArray>() =>
            {
                let rows = (0..count)
                    .map(|k| payload.get_item(k))
                    .collect::<PyResult<_>>()?;
                self.per_lane(corner, rows)
            }
            (input, _, None) => self
                .predict_now
                .call1((input.into_batch(py)?, count))
                .map(Output::Batch),
        };
        called.or_else(|err| {
            if !err.is_instance_of::<PyException>(py) {
                return Err(err);
            }
            let raised = err.value(py).clone();
            let failure = self.failure.call1((&raised, rounds))?;
            if failure.is(&raised) {
                return Err(err);
            }
            let failure = PyErr::from_value(failure);
            failure.set_cause(py, Some(err));
            Err(failure)
        })
    }

    /// The per-lane corner called on each lane's input in lane order, the outputs stacked:
    /// plain Python ints kept as integers (an int64 array, as `np.asarray` stacks them, once
    /// they are made a batch), plain floats straight into a float64 array; anything else by
    /// `combine`.
    fn per_lane(
        &self,
        corner: &Bound<'py, PyAny>,
        rows: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Output<'py>> {
        let py = corner.py();
        let count = rows.len();
        let outputs = rows
            .into_iter()
            .map(|row| self.lane_arg.call(corner, &row))
            .collect::<PyResult<Vec<_>>>()?;
        if outputs
            .iter()
            .all(|output| output.is_exact_instance_of::<PyInt>())
        {
            let values: Option<Vec<i64>> = outputs.iter().map(|o| o.extract().ok()).collect();
            if let Some(values) = values {
                return Ok(Output::Integers(values));
            }
        } else if outputs
            .iter()
            .all(|output| output.is_exact_instance_of::<PyFloat>())
        {
            let values = outputs
                .iter()
                .map(|output| output.extract::<f64>())
                .collect::<PyResult<Vec<_>>>()?;
            return Ok(Output::Batch(PyArray1::from_vec(py, values).into_any()));
        }
        self.combine
            .call1((PyList::new(py, outputs)?, count))
            .map(Output::Batch)
    }
}

/// The model's input for a round's predict lanes.
enum Input<'py> {
    /// The payload `begin_round` returns: `[P, ...]` arrays, or a dict of them.
    Batch(Bound<'py, PyAny>),
    /// Each lane's input as an array of its own (`ObservationAssembler::assemble_rows`), for
    /// a per-lane corner.
    Rows(Vec<Bound<'py, PyAny>>),
}

impl<'py> Input<'py> {
    /// The input as the payload `begin_round` returns.
    fn into_batch(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Input::Batch(payload) => Ok(payload),
            Input::Rows(rows) => numpy(py)?
                .getattr("stack")?
                .call1((PyList::new(py, rows)?,)),
        }
    }
}

/// The model's output for a round's predict lanes.
enum Output<'py> {
    /// What `take_actions` takes: `[P, ...]` (or chunks, or a dict of them; None for no lane).
    Batch(Bound<'py, PyAny>),
    /// A per-lane corner's plain Python ints, one per lane.
    Integers(Vec<i64>),
}

impl<'py> Output<'py> {
    /// The output as `take_actions` takes it.
    fn into_batch(self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            Output::Batch(output) => output,
            Output::Integers(values) => PyArray1::from_vec(py, values).into_any(),
        }
    }
}

/// `count` equal shares of a duration `ns`, the first `ns % count` one nanosecond longer, so
/// they add up to `ns` (none for `count = 0`).
fn shares(ns: u64, count: usize) -> impl Iterator<Item = u64> {
    let (share, remainder) = match count as u64 {
        0 => (0, 0),
        count => (ns / count, ns % count),
    };
    (0..count as u64).map(move |k| share + u64::from(k < remainder))
}

/// `count` calls that one timing of `ns` spans, into `stats`: their `shares`.
fn record_shared(stats: &mut LatencyStats, ns: u64, count: usize) {
    for share in shares(ns, count) {
        stats.add(share);
    }
}

/// `value` as a duration in nanoseconds: an int64 that is not negative.
fn duration_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    let ns = i64_arg(value, name)?;
    if ns < 0 {
        return Err(PyValueError::new_err(format!(
            "{name} must be a duration in nanoseconds (>= 0), got {ns}"
        )));
    }
    Ok(ns)
}

/// A lambda that unpacks a value into `names` as an assignment does: the same results and the
/// same errors (`cannot unpack non-iterable ...`, `not enough values to unpack ...`) as
/// `a, b, c = value` in the running Python, whatever its version words them as.
fn unpacker<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    code: &'static std::ffi::CStr,
) -> PyResult<&'py Bound<'py, PyAny>> {
    Ok(cell
        .get_or_try_init(py, || py.eval(code, None, None).map(Bound::unbind))?
        .bind(py))
}

/// `(observation, reward, terminated, truncated, info)` of what an env's `step` returned.
pub(crate) fn unpack_step<'py>(result: Bound<'py, PyAny>) -> PyResult<[Bound<'py, PyAny>; 5]> {
    let tuple = match result.cast_into_exact::<PyTuple>() {
        Ok(tuple) if tuple.len() == 5 => tuple,
        Ok(tuple) => unpack_slow(tuple.into_any())?,
        Err(err) => unpack_slow(err.into_inner())?,
    };
    let item = |index| tuple.get_item(index);
    Ok([item(0)?, item(1)?, item(2)?, item(3)?, item(4)?])
}

#[cold]
fn unpack_slow(result: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyTuple>> {
    static UNPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let code = c"lambda r: [(o, w, te, tr, i) for o, w, te, tr, i in (r,)][0]";
    Ok(unpacker(result.py(), &UNPACK, code)?
        .call1((result,))?
        .cast_into::<PyTuple>()?)
}

/// The three `LatencyStats` of `stats`, unpacked as `a, b, c = stats` does.
fn unpack_stats<'py>(stats: &Bound<'py, PyAny>) -> PyResult<[Bound<'py, LatencyStats>; 3]> {
    static UNPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let code = c"lambda s: [(p, e, r) for p, e, r in (s,)][0]";
    let unpacked = unpacker(stats.py(), &UNPACK, code)?
        .call1((stats,))?
        .cast_into::<PyTuple>()?;
    let item = |index: usize| {
        same_core::<LatencyStats>(
            &unpacked.get_item(index)?,
            &format!("stats[{index}]"),
            "a LatencyStats",
        )
    };
    Ok([item(0)?, item(1)?, item(2)?])
}

/// `value` as an instance of the Rust core's class `T`, or a `TypeError` naming `name`.
fn same_core<'py, T: PyClass>(
    value: &Bound<'py, PyAny>,
    name: &str,
    expected: &str,
) -> PyResult<Bound<'py, T>> {
    if let Ok(object) = value.cast::<T>() {
        return Ok(object.clone());
    }
    let kind = value.get_type();
    Err(PyTypeError::new_err(format!(
        "{name} must be {expected} from the same core (rlmesh._core), got {}.{}",
        kind.module()?,
        kind.qualname()?
    )))
}

/// The error of `finish` asked to finish a lane whose episode is still being stepped.
fn still_running(lane: i64, episode_id: i64) -> PyErr {
    PyValueError::new_err(format!(
        "lane {lane} episode {episode_id} is still running: only lanes end_round returned as \
         ended may be finished"
    ))
}

/// `None`, or `value` checked as a positive int or float (not a bool), as the caps take it.
fn optional_positive<'py>(
    value: Option<&Bound<'py, PyAny>>,
    name: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let number = value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>();
    if value.is_instance_of::<PyBool>() || !number || !value.gt(0)? {
        return Err(PyValueError::new_err(format!(
            "{name} must be None or a positive number, got {}",
            value.repr()?
        )));
    }
    Ok(Some(value.clone()))
}

/// `max_episode_steps` checked: None, or a positive integer (a cap past i64 is never reached,
/// like `i64::MAX`).
fn step_cap(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let integer = value.is_instance_of::<PyInt>()
        || value.is_instance(&numpy(value.py())?.getattr("integer")?)?;
    if value.is_instance_of::<PyBool>() || !integer || value.lt(1)? {
        return Err(PyValueError::new_err(format!(
            "max_episode_steps must be None or a positive integer, got {}",
            value.repr()?
        )));
    }
    let steps = value.py().get_type::<PyInt>().call1((value,))?;
    Ok(Some(steps.extract::<i64>().unwrap_or(i64::MAX)))
}

/// Whether an episode that took `steps` steps and `elapsed_ns` has reached a cap.
fn over_cap(steps: i64, max_steps: Option<i64>, elapsed_ns: i128, max_ns: Option<f64>) -> bool {
    if max_steps.is_some_and(|max_steps| steps >= max_steps) {
        return true;
    }
    max_ns.is_some_and(|max_ns| at_least(elapsed_ns, max_ns))
}

/// Whether `lane`'s episode, one step further at `now_ns`, reaches a cap. The steps and the
/// start of the clock are the ledger's, so the caps and `duration_s` read one clock.
fn cap_reached(
    ledger: &RouteLedger,
    lane: usize,
    now_ns: i64,
    max_steps: Option<i64>,
    max_ns: Option<f64>,
) -> bool {
    let elapsed_ns = i128::from(now_ns) - i128::from(ledger.lane_started_ns(lane));
    over_cap(ledger.lane_steps(lane) + 1, max_steps, elapsed_ns, max_ns)
}

/// `value >= threshold` exactly, as Python compares an int with a float: an integer is at
/// least `threshold` when it is at least `ceil(threshold)`. The cast saturates, so an infinite
/// or huge threshold is never reached.
fn at_least(value: i128, threshold: f64) -> bool {
    value >= threshold.ceil() as i128
}

/// `until_ns` as an i64 clock reading: an integer past i64 either way saturates (every clock
/// reading is below a huge one and above a hugely negative one); anything else is refused.
fn deadline_ns(until_ns: &Bound<'_, PyAny>) -> PyResult<i64> {
    let integer = !until_ns.is_instance_of::<PyBool>()
        && (until_ns.is_instance_of::<PyInt>()
            || until_ns.is_instance(&numpy(until_ns.py())?.getattr("integer")?)?);
    if !integer {
        return Err(PyTypeError::new_err(format!(
            "until_ns must be an integer time.perf_counter_ns() reading, got {}",
            until_ns.repr()?
        )));
    }
    Ok(match until_ns.extract::<i64>() {
        Ok(until_ns) => until_ns,
        Err(_) if until_ns.gt(0)? => i64::MAX,
        Err(_) => i64::MIN,
    })
}

/// `time.perf_counter_ns()` without calling Python: one reading taken at construction, plus
/// the `Instant`s elapsed since (both are the monotonic clock).
struct Clock {
    anchor_ns: i64,
    anchor: Instant,
}

impl Clock {
    fn new(py: Python<'_>) -> PyResult<Self> {
        let anchor_ns = py
            .import("time")?
            .getattr("perf_counter_ns")?
            .call0()?
            .extract::<i64>()?;
        Ok(Clock {
            anchor_ns,
            anchor: Instant::now(),
        })
    }

    fn ns_at(&self, instant: Instant) -> i64 {
        self.anchor_ns
            .saturating_add(elapsed_ns(self.anchor, instant) as i64)
    }
}

fn elapsed_ns(start: Instant, end: Instant) -> u64 {
    end.saturating_duration_since(start).as_nanos() as u64
}

/// The numpy scalar types whose `float()` and truth value are what numpy's casts give.
fn numpy_scalars(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static TYPES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let types = TYPES.get_or_try_init(py, || {
        let numpy = py.import("numpy")?;
        let names = [
            "float32",
            "float16",
            "bool_",
            "signedinteger",
            "unsignedinteger",
        ];
        let types = names
            .iter()
            .map(|name| numpy.getattr(*name))
            .collect::<PyResult<Vec<_>>>()?;
        Ok::<_, PyErr>(PyTuple::new(py, types)?.unbind())
    })?;
    Ok(types.bind(py))
}

/// One column of a round's step results into `column` (cleared first): each value read
/// directly, or, when `read` says None for one, all of them handed to `numpy.array(values,
/// dtype)` and checked as `vector(array, dtype, name)`, as the Python core does.
pub(crate) fn read_column<'py, T: numpy::Element + Copy>(
    values: &[Bound<'py, PyAny>],
    dtype: Dtype,
    name: &str,
    read: impl Fn(&Bound<'py, PyAny>) -> PyResult<Option<T>>,
    column: &mut Vec<T>,
) -> PyResult<()> {
    column.clear();
    for value in values {
        match read(value)? {
            Some(x) => column.push(x),
            None => {
                let py = value.py();
                let array = py
                    .import("numpy")?
                    .getattr("array")?
                    .call1((PyList::new(py, values)?, dtype.numpy_name()))?;
                column.clear();
                column.extend_from_slice(vector::<T>(&array, dtype, name)?.as_slice()?);
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A reward as `numpy.array(rewards, dtype=float64)` reads it, when it is a plain scalar.
pub(crate) fn read_reward(value: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    if let Ok(float) = value.cast::<PyFloat>() {
        return Ok(Some(float.value()));
    }
    if value.is_instance_of::<PyInt>() || value.is_instance(numpy_scalars(value.py())?)? {
        return Ok(value.extract::<f64>().ok());
    }
    Ok(None)
}

/// A flag as `numpy.array(flags, dtype=bool)` reads it, when it is a plain scalar.
pub(crate) fn read_flag(value: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Some(flag.is_true()));
    }
    if value.is_instance_of::<PyInt>()
        || value.is_instance_of::<PyFloat>()
        || value.is_instance(numpy_scalars(value.py())?)?
    {
        return Ok(value.is_truthy().ok());
    }
    Ok(None)
}

/// `leaf` (or each leaf of a dict of them) replaced by `map(leaf)`.
fn map_leaves<'py>(
    tree: &Bound<'py, PyAny>,
    map: &impl Fn(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let Ok(dict) = tree.cast::<PyDict>() else {
        return map(tree);
    };
    let mapped = PyDict::new(tree.py());
    for (key, value) in dict.iter() {
        mapped.set_item(key, map_leaves(&value, map)?)?;
    }
    Ok(mapped.into_any())
}

/// `array.reshape(*leading, *array.shape[skip:])`.
fn reshaped<'py>(
    array: &Bound<'py, PyAny>,
    leading: &[usize],
    shape_of: &Bound<'py, PyAny>,
    skip: isize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = array.py();
    let rest = shape_of
        .getattr("shape")?
        .get_item(PySlice::new(py, skip, isize::MAX, 1))?;
    let mut sizes: Vec<Bound<'py, PyAny>> = leading
        .iter()
        .map(|&size| Ok(size.into_pyobject(py)?.into_any()))
        .collect::<PyResult<_>>()?;
    for size in rest.try_iter()? {
        sizes.push(size?);
    }
    array.call_method1("reshape", PyTuple::new(py, sizes)?)
}

/// A keyword argument as it was given: `None` when it was left out, `Some` of whatever was
/// passed (Python's `None` included), for an argument whose default is not `None`.
struct Given<'py>(Option<Bound<'py, PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;

    fn extract(value: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(value.to_owned())))
    }
}

/// `overflow` checked: `"idle"` when left out, else `"idle"` or `"surplus"`.
fn overflow_arg(overflow: Option<&Bound<'_, PyAny>>) -> PyResult<Overflow> {
    let Some(value) = overflow else {
        return Ok(Overflow::Idle);
    };
    match value.extract::<String>().ok().as_deref() {
        Some("idle") => Ok(Overflow::Idle),
        Some("surplus") => Ok(Overflow::Surplus),
        _ => Err(PyValueError::new_err(format!(
            "overflow must be 'idle' or 'surplus', got {}",
            value.repr()?
        ))),
    }
}

/// Every per-lane part of one run: episode lifecycle, rounds, frame windows, chunk queues.
///
/// ``RoundRunner(num_lanes, episodes, observation_plan, action_plan, *, execution_horizon=None,
/// ensemble=None, seeds=None, base_seed=0, trial_index_base=0, indices=None, overflow="idle",
/// max_episode_steps=None, max_episode_seconds=None)`` builds and owns the run's ledger,
/// observation assembler, action applier and (with an ``execution_horizon``) chunk queues or
/// (with an ``ensemble`` rate) the temporal ensembles' buffers.
/// See ``rlmesh._pycore.rounds.RoundRunner`` for the full contract; both cores behave alike.
///
/// Example:
///     >>> runner = RoundRunner(2, 10, plan.observation, plan.action, max_episode_steps=500)
///     >>> starts = runner.start([0, 1], now_ns=time.perf_counter_ns())
///     >>> runner.set_observations(starts.lanes, [envs[lane].reset(seed=seed)[0]
///     ...     for lane, seed in zip(starts.lanes, starts.seeds)])
///     >>> ended, infos, rounds, lane_steps = runner.run_rounds(
///     ...     model, [env.step for env in envs], "CartPole-v1", until_ns=deadline,
///     ...     stats=[predict_stats, step_stats, round_stats])
///     >>> summaries, episode_ids, model_ends = runner.finish(ended, [None] * len(ended))
#[pyclass(module = "rlmesh._core")]
pub struct RoundRunner {
    ledger: RouteLedger,
    assembler: ObservationAssembler,
    applier: ActionApplier,
    queues: Option<ChunkQueues>,
    ensembles: Option<TemporalEnsembles>,
    overflow: Overflow,
    max_steps: Option<i64>,
    max_ns: Option<f64>,
    observations: Vec<Option<Py<PyAny>>>,
    /// When each lane's episode took its last step: the end of its clock.
    ended_ns: Vec<i64>,
    rounds: u64,
    // The open round: its running lanes, the lanes predicted for, each running lane's model
    // time.
    running: Vec<i64>,
    predict_lanes: Vec<i64>,
    predict_ns: Vec<i64>,
    /// Rounds set aside by `park_round`, by key, while their lanes' envs step; a parked
    /// lane is in no other round until its round is resumed.
    parked: HashMap<i64, ParkedRound>,
    in_parked_round: Vec<bool>,
    /// The round before's `running` and `predict_lanes`, for the next round to fill.
    spare_running: Vec<i64>,
    spare_predict_lanes: Vec<i64>,
    /// The predict lanes' episode ids, kept for the next round to fill.
    spare_ids: Vec<i64>,
    /// Scratch, all false between calls: which lanes a round predicts for.
    predicted: Vec<bool>,
    /// Each lane's running digests (`digests`).
    digests: LaneDigests,
    /// Scratch: a round's truncation flags as the envs returned them, before the caps.
    env_truncated: Vec<bool>,
    clock: Clock,
}

/// An open round set aside: its running lanes, predicted lanes and model time per lane.
struct ParkedRound {
    running: Vec<i64>,
    predict_lanes: Vec<i64>,
    predict_ns: Vec<i64>,
}

/// What `RoundRunner::step_all` read of one call that stepped every running lane: per lane
/// that stepped, in the running lanes' order, and the positions of those that failed.
struct WholeStep<'py> {
    rewards: PyReadonlyArray1<'py, f64>,
    terminated: PyReadonlyArray1<'py, bool>,
    truncated: PyReadonlyArray1<'py, bool>,
    infos: Vec<Bound<'py, PyAny>>,
    lane_ns: Vec<i64>,
    failed: Vec<usize>,
    now: Instant,
}

/// The phases of a round with their arguments already read.
impl RoundRunner {
    fn lane_count(&self) -> usize {
        self.observations.len()
    }

    /// `lanes` as a vector, refusing a lane out of range (a lane may be given twice).
    fn checked(&self, lanes: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let lanes = lanes_arg(lanes)?;
        let lanes = lanes.as_slice()?;
        let num_lanes = self.lane_count();
        if let Some(lane) = lanes
            .iter()
            .find(|&&lane| lane < 0 || lane as u64 >= num_lanes as u64)
        {
            return Err(PyValueError::new_err(format!(
                "lane {lane} is out of range for {num_lanes} lanes"
            )));
        }
        Ok(lanes.to_vec())
    }

    /// The latest raw observation of each of `lanes` (None before its first reset).
    fn raw_observations<'py>(&self, py: Python<'py>, lanes: &[i64]) -> Vec<Bound<'py, PyAny>> {
        lanes
            .iter()
            .map(|&lane| match &self.observations[lane as usize] {
                Some(observation) => observation.bind(py).clone(),
                None => py.None().into_bound(py),
            })
            .collect()
    }

    /// Evict the frame windows and queued actions of episodes that are over; the model ends
    /// they owe.
    fn release(&mut self, episode_ids: &[i64]) -> Vec<i64> {
        for &episode_id in episode_ids {
            self.assembler.evict(episode_id);
            if let Some(queues) = &mut self.queues {
                queues.drop_episode(episode_id);
            }
            if let Some(ensembles) = &mut self.ensembles {
                ensembles.drop_episode(episode_id);
            }
        }
        self.ledger.take_model_ends(episode_ids)
    }

    /// Mark `lanes` in the `predicted` scratch (`true`), or clear them again (`false`).
    fn mark(&mut self, lanes: &[i64], value: bool) {
        for &lane in lanes {
            self.predicted[lane as usize] = value;
        }
    }

    /// Open a round: set its running and predicted lanes; the model's input when some lane
    /// predicts: each lane's own (`Input::Rows`) when `rows` asks for it and the plan allows
    /// it, else the payload. The round's lanes are the running lanes in no parked round and,
    /// with `only`, among those.
    fn begin<'py>(
        &mut self,
        py: Python<'py>,
        rows: bool,
        only: Option<&[bool]>,
    ) -> PyResult<Option<Input<'py>>> {
        // Filled into the previous round's vectors, which keep their allocations.
        let mut running = std::mem::take(&mut self.spare_running);
        self.ledger.running_into(&mut running);
        if only.is_some() || !self.parked.is_empty() {
            let parked = &self.in_parked_round;
            running.retain(|&lane| {
                let lane = lane as usize;
                !parked[lane] && only.is_none_or(|only| only[lane])
            });
        }
        let mut predict_lanes = std::mem::take(&mut self.spare_predict_lanes);
        predict_lanes.clone_from(&running);
        if let Some(queues) = &mut self.queues {
            if !running.is_empty() {
                predict_lanes = queues.needing_predict(&running)?;
                if predict_lanes.len() < running.len() {
                    self.mark(&predict_lanes, true);
                    let replaying: Vec<i64> = running
                        .iter()
                        .copied()
                        .filter(|&lane| !self.predicted[lane as usize])
                        .collect();
                    self.mark(&predict_lanes, false);
                    let raw = self.raw_observations(py, &replaying);
                    let ids = self.ledger.episode_ids_of(&replaying);
                    self.assembler.push_frames(&raw, &ids)?;
                }
            }
        }
        let mut payload = None;
        if !predict_lanes.is_empty() {
            let raw = self.raw_observations(py, &predict_lanes);
            let mut ids = std::mem::take(&mut self.spare_ids);
            ids.clear();
            ids.extend(
                predict_lanes
                    .iter()
                    .map(|&lane| self.ledger.lane_episode_id(lane)),
            );
            let lane_rows = match rows {
                // Each raw observation is held by its lane's slot and by `raw`.
                true => self.assembler.assemble_rows(py, &raw, &ids, 2)?,
                false => None,
            };
            payload = Some(match lane_rows {
                Some(lane_rows) => Input::Rows(lane_rows),
                None => Input::Batch(self.assembler.assemble_frames(py, &raw, &ids)?),
            });
            self.spare_ids = ids;
        }
        // Until `take` says otherwise (it is not called when no lane runs), no lane predicted.
        self.predict_ns.clear();
        self.predict_ns.resize(running.len(), 0);
        self.spare_running = std::mem::replace(&mut self.running, running);
        self.spare_predict_lanes = std::mem::replace(&mut self.predict_lanes, predict_lanes);
        Ok(payload)
    }

    /// One env action per running lane of the open round.
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        output: &Bound<'py, PyAny>,
        predict_ns: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.charge(predict_ns)?;
        self.actions(py, output)
    }

    /// The open round's predict lanes predicted, in `predict_ns`: each is charged its share.
    fn charge(&mut self, predict_ns: i64) -> PyResult<()> {
        let predict_lanes = std::mem::take(&mut self.predict_lanes);
        if !predict_lanes.is_empty() {
            let marked = self.ledger.mark_predicted(&predict_lanes);
            if let Err(err) = marked {
                self.predict_lanes = predict_lanes;
                return Err(err.into());
            }
        }
        self.mark(&predict_lanes, true);
        let predicted = &self.predicted;
        // `predict_lanes` keep the running lanes' order, so the running lanes meet their
        // shares in order.
        let mut charged = shares(predict_ns as u64, predict_lanes.len());
        self.predict_ns.clear();
        self.predict_ns.extend(self.running.iter().map(|&lane| {
            if predicted[lane as usize] {
                charged.next().unwrap_or(0) as i64
            } else {
                0
            }
        }));
        self.mark(&predict_lanes, false);
        self.predict_lanes = predict_lanes;
        Ok(())
    }

    /// One env action per running lane of the open round, its predict lanes charged.
    fn actions<'py>(
        &mut self,
        py: Python<'py>,
        output: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.ensembles.is_some() {
            return self.ensembled(py, output);
        }
        let applier = &self.applier;
        let ledger = &self.ledger;
        let Some(queues) = &mut self.queues else {
            let lane_text = row_text(ledger, &self.running, 1);
            let actions = applier.apply(py, output, &self.running, &lane_text)?;
            self.digests.act(&self.running, &actions)?;
            return Ok(actions);
        };
        let predict_lanes = &self.predict_lanes;
        if !predict_lanes.is_empty() {
            let count = predict_lanes.len();
            let (horizon, _) = chunk_leaves(output, Some(count as u64))?;
            let kept = (horizon as u64).min(queues.execution_horizon()) as usize;
            let slice = py.get_type::<PySlice>();
            let index = PyTuple::new(
                py,
                [slice.call1((py.None(),))?, slice.call1((py.None(), kept))?],
            )?;
            let asarray = numpy(py)?.getattr("asarray")?;
            let flat = map_leaves(output, &|leaf| {
                let leaf = asarray.call1((leaf,))?;
                reshaped(&leaf.get_item(&index)?, &[count * kept], &leaf, 2)
            })?;
            let repeated: Vec<i64> = predict_lanes
                .iter()
                .flat_map(|&lane| std::iter::repeat_n(lane, kept))
                .collect();
            let lane_text = row_text(ledger, predict_lanes, kept);
            let applied = applier.apply(py, &flat, &repeated, &lane_text)?;
            let chunks = map_leaves(&applied, &|leaf| reshaped(leaf, &[count, kept], leaf, 1))?;
            let ids = self.ledger.episode_ids_of(predict_lanes);
            queues.push_lanes(py, predict_lanes, &ids, &chunks)?;
        }
        let ids = self.ledger.episode_ids_of(&self.running);
        let actions = queues.pop_lanes(py, &self.running, &ids)?;
        self.digests.act(&self.running, &actions)?;
        Ok(actions)
    }

    /// One env action per running lane (every one predicted): each chunk whole, as env
    /// actions, into its lane's buffer, and the lane's average for this step out.
    fn ensembled<'py>(
        &mut self,
        py: Python<'py>,
        output: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let count = self.running.len();
        let (horizon, _) = chunk_leaves(output, Some(count as u64))?;
        let asarray = numpy(py)?.getattr("asarray")?;
        let flat = map_leaves(output, &|leaf| {
            let leaf = asarray.call1((leaf,))?;
            reshaped(&leaf, &[count * horizon], &leaf, 2)
        })?;
        let repeated: Vec<i64> = self
            .running
            .iter()
            .flat_map(|&lane| std::iter::repeat_n(lane, horizon))
            .collect();
        let lane_text = row_text(&self.ledger, &self.running, horizon);
        let applied = self.applier.apply(py, &flat, &repeated, &lane_text)?;
        let chunks = map_leaves(&applied, &|leaf| reshaped(leaf, &[count, horizon], leaf, 1))?;
        let ids = self.ledger.episode_ids_of(&self.running);
        let ensembles = self.ensembles.as_mut().expect("called with ensembles");
        ensembles.push_lanes(py, &self.running, &ids, &chunks)?;
        let actions = ensembles.pop_lanes(py, &self.running, &ids)?;
        self.digests.act(&self.running, &actions)?;
        Ok(actions)
    }

    /// Step every running lane in one `step(lanes, actions) -> StepBatch` call, keeping each
    /// stepped lane's observation; each stepped lane is charged its share of the call's time.
    /// A `LaneFailures` it raises, with `failures` given, puts its errors there and its
    /// `outcome` (the other lanes' batch) stands for the step; an `RlmeshError` is raised as
    /// it is, any other exception as an `EnvError` naming the env, as a lane's step would be.
    fn step_all<'py>(
        &mut self,
        py: Python<'py>,
        step: &Bound<'py, PyAny>,
        actions: &Bound<'py, PyAny>,
        env_name: &Bound<'py, PyAny>,
        failures: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<WholeStep<'py>> {
        let started = Instant::now();
        let outcome = step.call1((PyArray1::from_slice(py, &self.running), actions));
        let now = Instant::now();
        let (batch, errors) = match (outcome, failures) {
            (Ok(batch), _) => (batch, None),
            (Err(err), Some(failures)) if err.is_instance_of::<LaneFailures>(py) => {
                let value = err.value(py);
                let errors = value.getattr("errors")?.cast_into::<PyDict>()?;
                failures.update(errors.as_mapping())?;
                (value.getattr("outcome")?, Some(errors))
            }
            (Err(err), _) if err.is_instance_of::<RlmeshError>(py) => return Err(err),
            (Err(err), _) if err.is_instance_of::<PyException>(py) => {
                return Err(env_failure(py, env_name, "step", err, None)?)
            }
            (Err(err), _) => return Err(err),
        };
        let stepped: Vec<i64> = lanes_arg(&batch.getattr("stepped")?)?.as_slice()?.to_vec();
        let mut failed = Vec::new();
        if stepped != self.running {
            let mut kept = stepped.iter().peekable();
            for (k, &lane) in self.running.iter().enumerate() {
                if kept.peek() == Some(&&lane) {
                    kept.next();
                } else if errors
                    .as_ref()
                    .is_some_and(|e| e.contains(lane).unwrap_or(false))
                {
                    failed.push(k);
                } else {
                    return Err(PyValueError::new_err(format!(
                        "the lanes' step moved lanes {stepped:?} when asked to step {:?}: lane \
                         {lane} neither stepped nor failed",
                        self.running
                    )));
                }
            }
            if kept.peek().is_some() {
                return Err(PyValueError::new_err(format!(
                    "the lanes' step moved lanes {stepped:?} when asked to step {:?}",
                    self.running
                )));
            }
        }
        let observations = batch.getattr("observations")?;
        if observations.len()? != stepped.len() {
            return Err(PyValueError::new_err(format!(
                "the lanes' step gave {} observations for {} lanes",
                observations.len()?,
                stepped.len()
            )));
        }
        for (&lane, observation) in stepped.iter().zip(observations.try_iter()?) {
            let observation = observation?;
            // The round's running lanes: what their step returned.
            self.digests
                .observe_steps(&[lane], std::slice::from_ref(&observation))?;
            self.observations[lane as usize] = Some(observation.unbind());
        }
        let infos = batch
            .getattr("infos")?
            .try_iter()?
            .collect::<PyResult<Vec<_>>>()?;
        let lane_ns = shares(elapsed_ns(started, now), stepped.len())
            .map(|share| share as i64)
            .collect();
        Ok(WholeStep {
            rewards: vector::<f64>(&batch.getattr("rewards")?, Dtype::Float64, "rewards")?,
            terminated: vector::<bool>(&batch.getattr("terminated")?, Dtype::Bool, "terminated")?,
            truncated: vector::<bool>(&batch.getattr("truncated")?, Dtype::Bool, "truncated")?,
            infos,
            lane_ns,
            failed,
            now,
        })
    }

    /// Record the env step of the open round's running lanes and close the round;
    /// `step_ns[k]` is the env time charged to running lane `k`. A cap reached sets the
    /// lane's flag in `truncated`.
    fn end(
        &mut self,
        rewards: &[f64],
        terminated: &[bool],
        truncated: &mut [bool],
        step_ns: &[i64],
        now_ns: i64,
    ) -> PyResult<Vec<i64>> {
        let count = self.running.len();
        for (name, length) in [
            ("rewards", rewards.len()),
            ("terminated", terminated.len()),
            ("truncated", truncated.len()),
        ] {
            if length != count {
                return Err(PyValueError::new_err(format!(
                    "{name} has {length} entries for {count} running lanes"
                )));
            }
        }
        self.env_truncated.clear();
        self.env_truncated.extend_from_slice(truncated);
        for (k, &lane) in self.running.iter().enumerate() {
            let capped = cap_reached(
                &self.ledger,
                lane as usize,
                now_ns,
                self.max_steps,
                self.max_ns,
            );
            if !terminated[k] && capped {
                truncated[k] = true;
            }
        }
        let ended = self.ledger.record_step(
            &self.running,
            rewards,
            terminated,
            truncated,
            step_ns,
            &self.predict_ns,
        )?;
        // Set once the ledger took the step: a refused round leaves the runner as it was.
        self.digests
            .step(&self.running, rewards, terminated, &self.env_truncated);
        for &lane in &ended {
            self.ended_ns[lane as usize] = now_ns;
        }
        self.rounds += 1;
        Ok(ended)
    }
}

#[pymethods]
impl RoundRunner {
    #[new]
    #[pyo3(signature = (
        num_lanes, episodes, observation_plan, action_plan, *, execution_horizon=None,
        ensemble=None, seeds=None, base_seed=None, trial_index_base=None, indices=None, overflow=Given(None),
        max_episode_steps=None, max_episode_seconds=None, digests=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        num_lanes: &Bound<'_, PyAny>,
        episodes: &Bound<'_, PyAny>,
        observation_plan: &Bound<'_, PyAny>,
        action_plan: &Bound<'_, PyAny>,
        execution_horizon: Option<&Bound<'_, PyAny>>,
        ensemble: Option<&Bound<'_, PyAny>>,
        seeds: Option<&Bound<'_, PyAny>>,
        base_seed: Option<&Bound<'_, PyAny>>,
        trial_index_base: Option<&Bound<'_, PyAny>>,
        indices: Option<&Bound<'_, PyAny>>,
        overflow: Given<'_>,
        max_episode_steps: Option<&Bound<'_, PyAny>>,
        max_episode_seconds: Option<&Bound<'_, PyAny>>,
        digests: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // Checked in the Python core's order, so a bad call fails alike in both.
        let overflow = overflow_arg(overflow.0.as_ref())?;
        if ensemble.is_some() && execution_horizon.is_some() {
            return Err(PyValueError::new_err(
                "ensemble and execution_horizon are two ways to execute chunks: a run averages \
                 every step's chunks (ensemble) or replays one chunk's actions \
                 (execution_horizon), not both",
            ));
        }
        let ledger = RouteLedger::from_args(
            py,
            num_lanes,
            episodes,
            seeds,
            base_seed,
            trial_index_base,
            indices,
        )?;
        let assembler = ObservationAssembler::py_new(observation_plan)?;
        let applier = ActionApplier::py_new(py, action_plan)?;
        let queues = execution_horizon
            .map(|horizon| ChunkQueues::py_new(num_lanes, horizon))
            .transpose()?;
        let ensembles = ensemble
            .map(|m| TemporalEnsembles::py_new(num_lanes, m))
            .transpose()?;
        let max_steps = step_cap(max_episode_steps)?;
        let max_ns = match optional_positive(max_episode_seconds, "max_episode_seconds")? {
            None => None,
            Some(value) => {
                let seconds: f64 = py.get_type::<PyFloat>().call1((value,))?.extract()?;
                Some(seconds * NS_PER_S)
            }
        };
        let digests = match digests {
            None => true,
            Some(value) if value.is_instance_of::<PyBool>() => value.is_truthy()?,
            Some(value) => {
                return Err(PyTypeError::new_err(format!(
                    "digests must be a bool, got {}",
                    value.get_type().name()?
                )))
            }
        };
        let num_lanes = ledger.lane_count();
        Ok(RoundRunner {
            ledger,
            assembler,
            applier,
            queues,
            ensembles,
            overflow,
            max_steps,
            max_ns,
            observations: (0..num_lanes).map(|_| None).collect(),
            ended_ns: vec![0; num_lanes],
            rounds: 0,
            running: Vec::new(),
            predict_lanes: Vec::new(),
            spare_running: Vec::new(),
            spare_predict_lanes: Vec::new(),
            spare_ids: Vec::new(),
            predict_ns: Vec::new(),
            parked: HashMap::new(),
            in_parked_round: vec![false; num_lanes],
            predicted: vec![false; num_lanes],
            digests: LaneDigests::new(num_lanes, digests),
            env_truncated: Vec::new(),
            clock: Clock::new(py)?,
        })
    }

    #[getter]
    fn num_lanes(&self) -> usize {
        self.lane_count()
    }

    /// Rounds recorded so far (``end_round`` calls, and the rounds of ``run_rounds``).
    #[getter]
    fn rounds(&self) -> u64 {
        self.rounds
    }

    /// True once every slot the run plays has been finished.
    #[getter]
    fn done(&self) -> bool {
        self.ledger.done()
    }

    /// Lane-steps spent on surplus episodes.
    #[getter]
    fn wasted_steps(&self) -> u64 {
        self.ledger.wasted_steps()
    }

    /// Every scored episode finished so far, in the order they finished.
    fn summaries(&self) -> Vec<EpisodeSummary> {
        self.ledger.summaries()
    }

    /// The run's observable state, for parity checks and debugging: the ledger's
    /// (``RouteLedger.snapshot``), plus ``frame_windows``, how many episodes hold frame
    /// windows, ``queued``, each lane's count of queued actions (None without queues), and
    /// ``ensembled``, each lane's count of chunks held for ensembling (None without).
    fn snapshot<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.ledger.snapshot(py)?;
        snapshot.set_item("frame_windows", self.assembler.window_count())?;
        match &mut self.queues {
            None => snapshot.set_item("queued", py.None())?,
            Some(queues) => snapshot.set_item(
                "queued",
                queues.py_queued(py, None)?.call_method0("tolist")?,
            )?,
        }
        match &mut self.ensembles {
            None => snapshot.set_item("ensembled", py.None())?,
            Some(ensembles) => snapshot.set_item(
                "ensembled",
                ensembles.py_held(py, None)?.call_method0("tolist")?,
            )?,
        }
        Ok(snapshot)
    }

    /// Start an episode on each vacant lane of ``lanes`` (``[K]``), claiming slots in order.
    ///
    /// Lanes past the last slot go idle or run surplus episodes (``overflow``). Each started
    /// episode's clock starts at ``now_ns``: take it just before resetting the lanes.
    #[pyo3(signature = (lanes, *, now_ns))]
    fn start(
        &mut self,
        py: Python<'_>,
        lanes: &Bound<'_, PyAny>,
        now_ns: &Bound<'_, PyAny>,
    ) -> PyResult<EpisodeStarts> {
        let now_ns = i64_arg(now_ns, "now_ns")?;
        let lanes = lanes_arg(lanes)?;
        let starts = self
            .ledger
            .start_episodes(lanes.as_slice()?, now_ns, self.overflow)?;
        // Their first observations come with set_observations, after the lanes' resets.
        self.digests.begin(&starts.lanes);
        self.digests.begin(&starts.surplus_lanes);
        Ok(EpisodeStarts::new(py, starts))
    }

    /// Start an episode on each lane an autoresetting vector restarted itself
    /// (``RouteLedger.observe_rolls``); ``set_observations`` has its first observation.
    #[pyo3(signature = (lanes, env_episode_ids, *, now_ns))]
    fn observe_rolls(
        &mut self,
        py: Python<'_>,
        lanes: &Bound<'_, PyAny>,
        env_episode_ids: &Bound<'_, PyAny>,
        now_ns: &Bound<'_, PyAny>,
    ) -> PyResult<EpisodeStarts> {
        let now_ns = i64_arg(now_ns, "now_ns")?;
        let lanes = lanes_arg(lanes)?;
        let env_ids = vector::<i64>(env_episode_ids, Dtype::Int64, "env_episode_ids")?;
        let starts = self
            .ledger
            .observe_rolls(lanes.as_slice()?, env_ids.as_slice()?, now_ns)?;
        for &lane in starts.lanes.iter().chain(&starts.surplus_lanes) {
            let observation = match &self.observations[lane as usize] {
                Some(observation) => observation.bind(py).clone(),
                None => py.None().into_bound(py),
            };
            self.digests.begin_with(lane as usize, &observation)?;
        }
        Ok(EpisodeStarts::new(py, starts))
    }

    /// Finish the episodes that ended on ``lanes`` (``[E]``, as ``end_round`` returned them).
    ///
    /// ``successes[k]``: what lane ``lanes[k]``'s final info said of success (None: nothing).
    /// Returns ``(summaries, episode_ids [E], model_ends [F])``: the scored episodes'
    /// summaries, every finished episode's id, and those whose end the model is owed, each
    /// once. The episodes' frame windows and queued actions go. A refused call (a lane out of
    /// range, given twice or still running, or not one success per lane) changes nothing.
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
        successes: &Bound<'py, PyAny>,
    ) -> PyResult<Finished<'py>> {
        let checked = self.checked(lanes)?;
        let outcomes = successes
            .try_iter()?
            .map(|success| {
                let success = success?;
                Ok(if success.is_none() {
                    None
                } else {
                    Some(success.is_truthy()?)
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        if outcomes.len() != checked.len() {
            return Err(PyValueError::new_err(format!(
                "successes has {} entries for {} lanes",
                outcomes.len(),
                checked.len()
            )));
        }
        let episode_ids = self.ledger.checked_episode_ids(&checked)?;
        for (&lane, &episode_id) in checked.iter().zip(&episode_ids) {
            if self.ledger.lane_state(lane as usize) == LaneState::Running {
                return Err(still_running(lane, episode_id));
            }
        }
        let mut completed = Vec::new();
        for ((&lane, &episode_id), &outcome) in checked.iter().zip(&episode_ids).zip(&outcomes) {
            // Each lane at its own clock's end.
            let ended_ns = self.ended_ns[lane as usize];
            completed.extend(self.ledger.complete_episodes(
                &[lane],
                &[episode_id],
                &[outcome],
                ended_ns,
                &[self.digests.episode(lane as usize)],
            )?);
        }
        let model_ends = self.release(&episode_ids);
        Ok((
            completed,
            PyArray1::from_vec(py, episode_ids),
            PyArray1::from_vec(py, model_ends),
        ))
    }

    /// Abandon the running episodes of ``lanes`` (``[K]``) whose env failed: to play each
    /// slot again (``errors[k]`` None) or to record it failed with the error ``errors[k]``.
    ///
    /// Returns ``(summaries, episode_ids [K], model_ends [F])`` as ``finish`` does. Inside an
    /// open round the lanes leave it, so ``end_round`` takes the other running lanes' rows.
    /// The episodes' frame windows and queued actions go. A refused call changes nothing.
    #[pyo3(signature = (lanes, errors, *, now_ns))]
    fn abandon<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
        errors: &Bound<'py, PyAny>,
        now_ns: &Bound<'py, PyAny>,
    ) -> PyResult<Finished<'py>> {
        let checked = self.checked(lanes)?;
        let episode_ids = self.ledger.checked_episode_ids(&checked)?;
        let now_ns = i64_arg(now_ns, "now_ns")?;
        let errors = errors
            .try_iter()?
            .enumerate()
            .map(|(k, error)| {
                let error = error?;
                if error.is_none() {
                    return Ok(None);
                }
                match error.cast::<PyString>() {
                    Ok(text) => Ok(Some(text.to_str()?.to_owned())),
                    Err(_) => Err(PyTypeError::new_err(format!(
                        "errors[{k}] must be None (play the slot again) or a str (the error the \
                         episode failed with), got {}",
                        error.get_type().name()?
                    ))),
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        let digests: Vec<_> = checked
            .iter()
            .map(|&lane| self.digests.episode(lane as usize))
            .collect();
        let failed = self
            .ledger
            .abandon_episodes(&checked, &errors, now_ns, &digests)?;
        let kept: Vec<usize> = (0..self.running.len())
            .filter(|&k| !checked.contains(&self.running[k]))
            .collect();
        if kept.len() < self.running.len() {
            self.predict_ns = kept.iter().map(|&k| self.predict_ns[k]).collect();
            self.running = kept.iter().map(|&k| self.running[k]).collect();
            self.predict_lanes.retain(|lane| !checked.contains(lane));
        }
        let model_ends = self.release(&episode_ids);
        Ok((
            failed,
            PyArray1::from_vec(py, episode_ids),
            PyArray1::from_vec(py, model_ends),
        ))
    }

    /// At teardown: every episode the model predicted on and was not told the end of.
    fn take_all_model_ends<'py>(&mut self, py: Python<'py>) -> Int64Array<'py> {
        PyArray1::from_vec(py, self.ledger.take_all_model_ends())
    }

    /// Lane ``lanes[k]``'s latest raw observation is ``observations[k]``.
    fn set_observations(
        &mut self,
        lanes: &Bound<'_, PyAny>,
        observations: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let checked = self.checked(lanes)?;
        let entries = observations.len()?;
        if entries != checked.len() {
            return Err(PyValueError::new_err(format!(
                "observations has {entries} entries for {} lanes",
                checked.len()
            )));
        }
        for (&lane, observation) in checked.iter().zip(observations.try_iter()?) {
            let observation = observation?;
            let running = self.ledger.lane_state(lane as usize) == LaneState::Running;
            self.digests.observe(lane as usize, &observation, running)?;
            self.observations[lane as usize] = Some(observation.unbind());
        }
        Ok(())
    }

    /// The latest raw observation of each of ``lanes`` (None before its first reset).
    fn observations<'py>(
        &self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let lanes = self.checked(lanes)?;
        PyList::new(py, self.raw_observations(py, &lanes))
    }

    /// ``[K]`` int64: the lanes whose episode (scored or surplus) is being stepped.
    fn running_lanes<'py>(&self, py: Python<'py>) -> Int64Array<'py> {
        PyArray1::from_vec(py, self.ledger.running())
    }

    /// ``[K]`` int64: the episode each of ``lanes`` holds (-1 for none).
    fn episode_ids<'py>(
        &mut self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
    ) -> PyResult<Int64Array<'py>> {
        let lanes = lanes_arg(lanes)?;
        let ids = self.ledger.checked_episode_ids(lanes.as_slice()?)?;
        Ok(PyArray1::from_vec(py, ids))
    }

    /// What each of ``lanes`` (``[K]``) holds: ``(indices [K], seeds, steps [K])``, the
    /// episode's slot (-1 for a surplus episode or none), its seed and the steps it took.
    fn lane_episodes<'py>(
        &self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
    ) -> PyResult<LaneEpisodes<'py>> {
        let checked = self.checked(lanes)?;
        let ledger = &self.ledger;
        let of = |read: fn(&RouteLedger, usize) -> i64| {
            let values = checked.iter().map(|&lane| read(ledger, lane as usize));
            PyArray1::from_vec(py, values.collect())
        };
        let seeds = checked
            .iter()
            .map(|&lane| ledger.lane_seed(lane as usize))
            .collect();
        Ok((
            of(RouteLedger::lane_index),
            seeds,
            of(RouteLedger::lane_steps),
        ))
    }

    /// Open a round over the running lanes (with ``lanes``, those among them) that are in no
    /// parked round: ``(running, predict_lanes, payload)``.
    #[pyo3(signature = (lanes=None))]
    fn begin_round<'py>(
        &mut self,
        py: Python<'py>,
        lanes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Opened<'py>> {
        let only = match lanes {
            Some(lanes) => {
                let mut only = vec![false; self.lane_count()];
                for lane in self.checked(lanes)? {
                    only[lane as usize] = true;
                }
                Some(only)
            }
            None => None,
        };
        let payload = match self.begin(py, false, only.as_deref())? {
            Some(input) => input.into_batch(py)?,
            None => py.None().into_bound(py),
        };
        Ok((
            PyArray1::from_slice(py, &self.running),
            PyArray1::from_slice(py, &self.predict_lanes),
            payload,
        ))
    }

    /// Set the open round aside under ``key`` while its lanes' envs step, so that another
    /// round can open over other lanes; ``resume_round(key)`` makes it the open round again.
    fn park_round(&mut self, key: i64) -> PyResult<()> {
        if self.parked.contains_key(&key) {
            return Err(PyValueError::new_err(format!(
                "a round is already parked under key {key}"
            )));
        }
        let round = ParkedRound {
            running: std::mem::take(&mut self.running),
            predict_lanes: std::mem::take(&mut self.predict_lanes),
            predict_ns: std::mem::take(&mut self.predict_ns),
        };
        for &lane in &round.running {
            self.in_parked_round[lane as usize] = true;
        }
        self.parked.insert(key, round);
        Ok(())
    }

    /// Make the round parked under ``key`` the open round again, in place of the last one.
    fn resume_round(&mut self, key: i64) -> PyResult<()> {
        let Some(round) = self.parked.remove(&key) else {
            return Err(PyValueError::new_err(format!(
                "no round is parked under key {key}"
            )));
        };
        for &lane in &round.running {
            self.in_parked_round[lane as usize] = false;
        }
        self.running = round.running;
        self.predict_lanes = round.predict_lanes;
        self.predict_ns = round.predict_ns;
        Ok(())
    }

    /// One env action per running lane of the open round; each predicted lane is charged
    /// its share of ``predict_ns`` (``predict_ns / P``, the shares adding up to it).
    fn take_actions<'py>(
        &mut self,
        py: Python<'py>,
        output: &Bound<'py, PyAny>,
        predict_ns: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let predict_ns = duration_arg(predict_ns, "predict_ns")?;
        self.take(py, output, predict_ns)
    }

    /// Record the env step of the open round's running lanes and close the round; each of
    /// the ``K`` running lanes is charged its share of ``step_ns`` (``step_ns / K``, the
    /// shares adding up to it).
    fn end_round<'py>(
        &mut self,
        py: Python<'py>,
        rewards: &Bound<'py, PyAny>,
        terminated: &Bound<'py, PyAny>,
        truncated: &Bound<'py, PyAny>,
        step_ns: &Bound<'py, PyAny>,
        now_ns: &Bound<'py, PyAny>,
    ) -> PyResult<Closed<'py>> {
        let step_ns = duration_arg(step_ns, "step_ns")?;
        let now_ns = i64_arg(now_ns, "now_ns")?;
        let rewards = vector::<f64>(rewards, Dtype::Float64, "rewards")?;
        let terminated = vector::<bool>(terminated, Dtype::Bool, "terminated")?;
        let truncated = vector::<bool>(truncated, Dtype::Bool, "truncated")?;
        let lane_ns: Vec<i64> = shares(step_ns as u64, self.running.len())
            .map(|share| share as i64)
            .collect();
        let mut truncated = truncated.as_slice()?.to_vec();
        let ended = self.end(
            rewards.as_slice()?,
            terminated.as_slice()?,
            &mut truncated,
            &lane_ns,
            now_ns,
        )?;
        Ok((
            PyArray1::from_vec(py, ended),
            PyArray1::from_vec(py, truncated),
        ))
    }

    /// Run whole rounds until an episode ends, a lane's env fails, no lane is running, or
    /// ``until_ns`` passed.
    ///
    /// Returns ``(ended, infos, rounds, lane_steps)``. ``model`` is the run's model as
    /// ``ModelHandler`` presents it (``predict_now``, ``lane_corner``, ``wants_episode_ids``,
    /// ``combine``, ``failure``); an error calling it is raised as what ``failure`` returns. A lane's
    /// ``step`` that raises an ``Exception`` becomes an ``EnvError`` naming the lane and the
    /// env, the error chained; with a ``failures`` dict, its ``"<ExceptionType>: <message>"``
    /// goes there under its lane instead, the lane leaves the round (its episode still
    /// running, to be abandoned), and the call returns after that round. Each lane's episode
    /// is charged its own env step's time, and each predicted lane its share of the model call.
    /// ``env_steps`` may instead be one callable that steps every running lane,
    /// ``step(lanes, actions) -> StepBatch`` (a `Lanes.step`; see ``step_all``), timed as one
    /// call.
    #[pyo3(signature = (model, env_steps, env_name, *, until_ns, stats, failures=None))]
    #[allow(clippy::too_many_arguments)]
    fn run_rounds<'py>(
        &mut self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
        env_steps: &Bound<'py, PyAny>,
        env_name: &Bound<'py, PyAny>,
        until_ns: &Bound<'py, PyAny>,
        stats: &Bound<'py, PyAny>,
        failures: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Ran<'py>> {
        let until_ns = deadline_ns(until_ns)?;
        let [predict_stats, step_stats, round_stats] = unpack_stats(stats)?;
        let model = ModelCalls::new(model)?;
        // A per-lane corner gets each lane's input as an array of its own, not a row of a
        // payload made only to be split again.
        let rows = model.lane_corner.is_some() && !model.wants_episode_ids;
        // One callable that steps every running lane at once, rather than a step per lane.
        let whole = env_steps.is_callable();
        // Each lane's `step`, looked up once per call, when the lane first steps.
        let mut steps: Vec<Option<Bound<'py, PyAny>>> = vec![None; self.lane_count()];
        let step_arg = OneArg::new(py)?;
        let (mut rounds, mut lane_steps) = (0, 0);
        let mut ended = Vec::new();
        let infos = PyList::empty(py);
        let mut observations = Vec::new();
        let mut rewards = Vec::new();
        let mut terminated = Vec::new();
        let mut truncated = Vec::new();
        let mut step_infos = Vec::new();
        let (mut reward_values, mut terminated_flags, mut truncated_flags) =
            (Vec::new(), Vec::new(), Vec::new());
        // Each lane's env step, timed on its own: `env.step` telemetry is per lane-step, and
        // each lane's episode is charged its own step.
        let mut lane_ns: Vec<i64> = Vec::new();
        // One reading ends a round and starts the next: a clock reading is a good part of a
        // round's own cost on a fast env.
        let mut round_start = Instant::now();
        loop {
            py.check_signals()?;
            let input = self.begin(py, rows, None)?;
            let count = self.running.len();
            if count == 0 {
                break;
            }
            let (mut output, mut predict_ns) = (Output::Batch(py.None().into_bound(py)), 0);
            if let Some(input) = input {
                let predict_start = Instant::now();
                let episode_ids = model
                    .wants_episode_ids
                    .then(|| self.ledger.episode_ids_of(&self.predict_lanes));
                output =
                    model.predict(input, self.predict_lanes.len(), episode_ids, self.rounds)?;
                let took = elapsed_ns(predict_start, Instant::now());
                let calls = if model.calls_per_lane {
                    self.predict_lanes.len()
                } else {
                    1
                };
                record_shared(&mut predict_stats.borrow_mut(), took, calls);
                predict_ns = took as i64;
            }
            self.charge(predict_ns)?;
            let (now, failed) = if whole {
                let actions = self.actions(py, &output.into_batch(py))?;
                let stepped = self.step_all(py, env_steps, &actions, env_name, failures)?;
                reward_values.clear();
                reward_values.extend_from_slice(stepped.rewards.as_slice()?);
                terminated_flags.clear();
                terminated_flags.extend_from_slice(stepped.terminated.as_slice()?);
                truncated_flags.clear();
                truncated_flags.extend_from_slice(stepped.truncated.as_slice()?);
                lane_ns = stepped.lane_ns;
                step_infos = stepped.infos;
                (stepped.now, stepped.failed)
            } else {
                let scalars = match &output {
                    Output::Integers(values)
                        if self.queues.is_none() && self.ensembles.is_none() =>
                    {
                        self.applier.discrete_scalars(py, values)?
                    }
                    _ => None,
                };
                let actions = match scalars {
                    Some(scalars) => {
                        if let Output::Integers(values) = &output {
                            self.digests.act_integers(&self.running, values);
                        }
                        LaneActions::PerLane(scalars)
                    }
                    None => {
                        let actions = self.actions(py, &output.into_batch(py))?;
                        lane_actions(&actions, count, &mut Vec::new())?
                    }
                };
                let mut lane_start = Instant::now();
                let mut failed: Vec<usize> = Vec::new();
                lane_ns.clear();
                observations.clear();
                rewards.clear();
                terminated.clear();
                truncated.clear();
                step_infos.clear();
                for k in 0..count {
                    let lane = self.running[k];
                    let stepped = (|| {
                        let step = &mut steps[lane as usize];
                        if step.is_none() {
                            *step = Some(env_steps.get_item(lane)?);
                        }
                        let step = step.as_ref().expect("looked up above");
                        unpack_step(step_arg.call(step, &actions.get(k)?)?)
                    })();
                    let [observation, reward, term, trunc, info] = match stepped {
                        Ok(result) => result,
                        Err(err) if err.is_instance_of::<PyException>(py) => {
                            let Some(failures) = failures else {
                                return Err(env_failure(py, env_name, "step", err, Some(lane))?);
                            };
                            let text =
                                format!("{}: {}", err.get_type(py).name()?, err.value(py).str()?);
                            failures.set_item(lane, text)?;
                            failed.push(k);
                            lane_start = Instant::now();
                            continue;
                        }
                        Err(err) => return Err(err),
                    };
                    let lane_end = Instant::now();
                    lane_ns.push(elapsed_ns(lane_start, lane_end) as i64);
                    lane_start = lane_end;
                    observations.push(observation);
                    rewards.push(reward);
                    terminated.push(term);
                    truncated.push(trunc);
                    step_infos.push(info);
                }
                let kept = self
                    .running
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| !failed.contains(k));
                if failed.is_empty() {
                    self.digests.observe_steps(&self.running, &observations)?;
                } else {
                    let lanes: Vec<i64> = kept.clone().map(|(_, &lane)| lane).collect();
                    self.digests.observe_steps(&lanes, &observations)?;
                }
                for ((_, &lane), observation) in kept.zip(observations.drain(..)) {
                    self.observations[lane as usize] = Some(observation.unbind());
                }
                // Read as the Python core's `np.array(..., dtype)` then `vector` read them.
                read_column(
                    &rewards,
                    Dtype::Float64,
                    "rewards",
                    read_reward,
                    &mut reward_values,
                )?;
                read_column(
                    &terminated,
                    Dtype::Bool,
                    "terminated",
                    read_flag,
                    &mut terminated_flags,
                )?;
                read_column(
                    &truncated,
                    Dtype::Bool,
                    "truncated",
                    read_flag,
                    &mut truncated_flags,
                )?;
                (lane_start, failed)
            };
            let count = if failed.is_empty() {
                count
            } else {
                // The failed lanes leave the round; the others' steps are recorded.
                let kept: Vec<usize> = (0..count).filter(|k| !failed.contains(k)).collect();
                self.running = kept.iter().map(|&k| self.running[k]).collect();
                self.predict_ns = kept.iter().map(|&k| self.predict_ns[k]).collect();
                kept.len()
            };
            {
                let mut step_stats = step_stats.borrow_mut();
                for &ns in &lane_ns {
                    step_stats.add(ns as u64);
                }
            }
            let round_ended = self.end(
                &reward_values,
                &terminated_flags,
                &mut truncated_flags,
                &lane_ns,
                self.clock.ns_at(now),
            )?;
            let round_end = Instant::now();
            round_stats
                .borrow_mut()
                .add(elapsed_ns(round_start, round_end));
            rounds += 1;
            lane_steps += count as u64;
            ended = round_ended;
            if !ended.is_empty() {
                // `ended` follows the order of the running lanes.
                let mut position = 0;
                for &lane in &ended {
                    while self.running[position] != lane {
                        position += 1;
                    }
                    infos.append(&step_infos[position])?;
                }
                break;
            }
            if !failed.is_empty() || self.clock.ns_at(round_end) >= until_ns {
                break;
            }
            round_start = round_end;
        }
        Ok((PyArray1::from_vec(py, ended), infos, rounds, lane_steps))
    }

    fn __repr__(&self) -> String {
        format!(
            "RoundRunner(num_lanes={}, rounds={})",
            self.lane_count(),
            self.rounds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_equal_but_for_the_remainder_and_add_up_to_the_whole() {
        assert_eq!(shares(10, 3).collect::<Vec<_>>(), [4, 3, 3]);
        assert_eq!(shares(2, 4).collect::<Vec<_>>(), [1, 1, 0, 0]);
        assert_eq!(shares(7, 1).collect::<Vec<_>>(), [7]);
        assert_eq!(shares(7, 0).count(), 0);
        assert_eq!(shares(u64::MAX, 5).sum::<u64>(), u64::MAX);
    }

    #[test]
    fn a_step_cap_truncates_at_exactly_the_cap() {
        assert!(!over_cap(4, Some(5), 0, None));
        assert!(over_cap(5, Some(5), 0, None));
        assert!(!over_cap(1_000, None, 1 << 40, None));
    }

    #[test]
    fn the_caps_read_each_episode_s_steps_and_clock_from_the_ledger() {
        let mut ledger = RouteLedger::create(1, 2, Vec::new(), 0, 0, None);
        ledger.start_episodes(&[0], 1_000, Overflow::Idle).unwrap();
        // The clock runs from the episode's start: 10 ms after it, not after 0.
        assert!(!cap_reached(&ledger, 0, 10_000_999, None, Some(1e7)));
        assert!(cap_reached(&ledger, 0, 10_001_000, None, Some(1e7)));
        let step = |ledger: &mut RouteLedger, ends: bool| {
            ledger
                .record_step(&[0], &[1.0], &[ends], &[false], &[1], &[1])
                .unwrap()
        };
        step(&mut ledger, false);
        // One step taken: the next one is the second.
        assert!(!cap_reached(&ledger, 0, 1_000, Some(3), None));
        assert!(cap_reached(&ledger, 0, 1_000, Some(2), None));
        step(&mut ledger, true);
        let summaries = ledger
            .complete_episodes(&[0], &[0], &[None], 10_001_000, &[])
            .unwrap();
        assert_eq!(summaries[0].duration_s, 0.01);
        // The next episode starts its own count and clock.
        ledger
            .start_episodes(&[0], 20_000_000, Overflow::Idle)
            .unwrap();
        assert!(!cap_reached(&ledger, 0, 20_000_000, Some(2), Some(1e7)));
        assert!(cap_reached(&ledger, 0, 30_000_000, Some(2), Some(1e7)));
        assert!(cap_reached(&ledger, 0, 20_000_000, Some(1), None));
    }

    #[test]
    fn a_time_cap_compares_the_integer_clock_with_the_float_cap_exactly() {
        // 1.5 ns: 1 is below it, 2 is not.
        assert!(!over_cap(1, None, 1, Some(1.5)));
        assert!(over_cap(1, None, 2, Some(1.5)));
        assert!(over_cap(1, None, 2, Some(2.0)));
        // Past 2**53 a float cannot tell neighbouring integers apart; the comparison still can.
        let cap = 2f64.powi(60);
        assert!(!at_least((1i128 << 60) - 1, cap));
        assert!(at_least(1i128 << 60, cap));
        // An infinite or huge cap is never reached.
        assert!(!at_least(i128::from(i64::MAX), f64::INFINITY));
        assert!(!at_least(i128::from(i64::MAX), 1e300));
    }
}
