//! The episode ledger of one route: slot claims, seeds, episode identity and per-lane scores.
//!
//! Mirrors `python/rlmesh/_pycore/ledger.py` name for name; that file is the specification
//! (lane states, claim rules, messages). Here the per-lane state lives in one `Vec<Lane>`
//! and every per-step method loops over lanes in Rust, taking numpy arrays for a whole group.

use std::collections::BTreeSet;
use std::ffi::CString;

use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList};

use crate::args::{count_arg, same_length, u64_arg, user_warning, ArgError, LaneMarks};
use crate::digests::hex_digest;
use crate::seeding::derive_seed;

/// The most lanes one route may have (the Python core refuses the same).
pub const MAX_LANES: u64 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneState {
    /// Holds no episode and may start one.
    Vacant,
    /// Holds an episode being stepped (scored or surplus).
    Running,
    /// `record_step` saw its episode end; awaits `complete_episodes`.
    Ended,
    /// Asked to start when no slot was left: never stepped again.
    Idle,
}

impl LaneState {
    pub fn name(self) -> &'static str {
        match self {
            LaneState::Vacant => "vacant",
            LaneState::Running => "running",
            LaneState::Ended => "ended",
            LaneState::Idle => "idle",
        }
    }
}

/// What lanes left without a slot do: go idle, or run unscored surplus episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    Idle,
    Surplus,
}

impl Overflow {
    pub fn parse(name: &str) -> Result<Self, ArgError> {
        match name {
            "idle" => Ok(Overflow::Idle),
            "surplus" => Ok(Overflow::Surplus),
            other => Err(ArgError(format!(
                "overflow must be 'idle' or 'surplus', got '{other}'"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
struct Lane {
    state: LaneState,
    episode_id: i64,
    surplus: bool,
    index: i64,
    seed: Option<u64>,
    trial: i64,
    steps: i64,
    reward: f64,
    // Sums of non-negative int64 timings: i128 cannot overflow where Python's ints never do.
    step_ns: i128,
    predict_ns: i128,
    terminated: bool,
    truncated: bool,
    started_ns: i64,
    predicted: bool,
    env_episode_id: Option<i64>,
}

impl Lane {
    fn vacant() -> Self {
        Lane {
            state: LaneState::Vacant,
            episode_id: -1,
            surplus: false,
            index: -1,
            seed: None,
            trial: 0,
            steps: 0,
            reward: 0.0,
            step_ns: 0,
            predict_ns: 0,
            terminated: false,
            truncated: false,
            started_ns: 0,
            predicted: false,
            env_episode_id: None,
        }
    }
}

/// One completed, scored episode.
///
/// ``seed`` is None when the environment chose the episode's start itself; ``success`` is None
/// when the final ``info`` said nothing about success. ``error`` is None for an episode that
/// ended, or the ``"<Type>: <message>"`` of the env failure it was abandoned with.
/// ``reset_digest`` and ``trajectory_digest`` are the episode's digests (16 hex digits), None
/// when its first observation never arrived or the runner keeps no digests.
#[pyclass(module = "rlmesh._core", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeSummary {
    pub index: i64,
    pub episode_id: i64,
    pub seed: Option<u64>,
    pub trial: i64,
    pub env_index: i64,
    pub steps: i64,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub success: Option<bool>,
    pub duration_s: f64,
    pub predict_ms: f64,
    pub step_ms: f64,
    pub error: Option<String>,
    pub reset_digest: Option<String>,
    pub trajectory_digest: Option<String>,
}

#[pymethods]
impl EpisodeSummary {
    /// The fields as a plain dict, in declaration order.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("index", self.index)?;
        dict.set_item("episode_id", self.episode_id)?;
        dict.set_item("seed", self.seed)?;
        dict.set_item("trial", self.trial)?;
        dict.set_item("env_index", self.env_index)?;
        dict.set_item("steps", self.steps)?;
        dict.set_item("reward", self.reward)?;
        dict.set_item("terminated", self.terminated)?;
        dict.set_item("truncated", self.truncated)?;
        dict.set_item("success", self.success)?;
        dict.set_item("duration_s", self.duration_s)?;
        dict.set_item("predict_ms", self.predict_ms)?;
        dict.set_item("step_ms", self.step_ms)?;
        dict.set_item("error", &self.error)?;
        dict.set_item("reset_digest", &self.reset_digest)?;
        dict.set_item("trajectory_digest", &self.trajectory_digest)?;
        Ok(dict)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let fields = self.to_dict(py)?;
        let parts: Vec<String> = fields
            .iter()
            .map(|(key, value)| Ok(format!("{key}={}", value.repr()?)))
            .collect::<PyResult<_>>()?;
        Ok(format!("EpisodeSummary({})", parts.join(", ")))
    }
}

/// What one start call started, as plain vectors (see `EpisodeStarts`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Starts {
    pub lanes: Vec<i64>,
    pub episode_ids: Vec<i64>,
    pub indices: Vec<i64>,
    pub seeds: Vec<Option<u64>>,
    pub trials: Vec<i64>,
    pub surplus_lanes: Vec<i64>,
    pub surplus_episode_ids: Vec<i64>,
}

/// What one ``RoundRunner.start`` or ``observe_rolls`` call started.
///
/// Scored starts (int64 arrays of shape ``[S]``, in the order the lanes were given):
/// ``lanes``, ``episode_ids``, ``indices``, ``trials``, and ``seeds``, a list of ``S`` ints or
/// None where the environment chose the start. ``surplus_lanes`` and ``surplus_episode_ids``
/// (``[U]``) are started but never scored; a lane in neither went idle.
#[pyclass(module = "rlmesh._core", frozen, get_all)]
pub struct EpisodeStarts {
    lanes: Py<PyArray1<i64>>,
    episode_ids: Py<PyArray1<i64>>,
    indices: Py<PyArray1<i64>>,
    seeds: Vec<Option<u64>>,
    trials: Py<PyArray1<i64>>,
    surplus_lanes: Py<PyArray1<i64>>,
    surplus_episode_ids: Py<PyArray1<i64>>,
}

fn int64_array(py: Python<'_>, values: Vec<i64>) -> Py<PyArray1<i64>> {
    PyArray1::from_vec(py, values).unbind()
}

impl EpisodeStarts {
    pub(crate) fn new(py: Python<'_>, starts: Starts) -> Self {
        EpisodeStarts {
            lanes: int64_array(py, starts.lanes),
            episode_ids: int64_array(py, starts.episode_ids),
            indices: int64_array(py, starts.indices),
            seeds: starts.seeds,
            trials: int64_array(py, starts.trials),
            surplus_lanes: int64_array(py, starts.surplus_lanes),
            surplus_episode_ids: int64_array(py, starts.surplus_episode_ids),
        }
    }
}

/// The per-route bookkeeping a `RoundRunner` advances every step; internal to the runner,
/// which owns one (Python never sees it).
///
/// See ``rlmesh._pycore.ledger.RouteLedger`` for the full contract; both cores behave alike.
#[derive(Debug, Clone)]
pub struct RouteLedger {
    num_lanes: usize,
    episodes: u64,
    /// The slots this ledger runs, in claim order: None for all of 0..M-1.
    indices: Option<Vec<u64>>,
    seeds: Vec<u64>,
    base_seed: u64,
    trial_index_base: u64,
    slots_claimed: u64,
    /// Slots whose episode was abandoned to be played again: claimed before any new slot,
    /// lowest first.
    returned: Vec<u64>,
    completed: u64,
    wasted_steps: u64,
    ignored_completions: u64,
    next_episode_id: i64,
    summaries: Vec<EpisodeSummary>,
    /// Episodes that ended after the model predicted on them and whose end the model has not
    /// been told yet.
    untold_model_ends: BTreeSet<i64>,
    lanes: Vec<Lane>,
    marks: LaneMarks,
}

/// The pure-Rust ledger: every rule, no Python objects.
impl RouteLedger {
    /// A ledger with already checked arguments (`from_args` checks them).
    pub fn create(
        num_lanes: usize,
        episodes: u64,
        seeds: Vec<u64>,
        base_seed: u64,
        trial_index_base: u64,
        indices: Option<Vec<u64>>,
    ) -> Self {
        RouteLedger {
            num_lanes,
            episodes,
            indices,
            seeds,
            base_seed,
            trial_index_base,
            slots_claimed: 0,
            returned: Vec::new(),
            completed: 0,
            wasted_steps: 0,
            ignored_completions: 0,
            next_episode_id: 0,
            summaries: Vec::new(),
            untold_model_ends: BTreeSet::new(),
            lanes: vec![Lane::vacant(); num_lanes],
            marks: LaneMarks::new(num_lanes),
        }
    }

    pub fn seed_for(&self, slot: u64) -> u64 {
        match self.seeds.get(slot as usize) {
            Some(&seed) => seed,
            None => derive_seed(self.base_seed, self.trial_index_base + slot),
        }
    }

    /// How many slots this ledger runs: M, or the number of `indices`.
    fn slot_count(&self) -> u64 {
        self.indices
            .as_ref()
            .map_or(self.episodes, |indices| indices.len() as u64)
    }

    /// The slot number of the `ordinal`-th claim.
    fn slot_at(&self, ordinal: u64) -> u64 {
        self.indices
            .as_ref()
            .map_or(ordinal, |indices| indices[ordinal as usize])
    }

    /// Claim the next `count` slots, or as many as remain: the returned ones first.
    fn claim_slots(&mut self, count: u64) -> Vec<u64> {
        let again = self.returned.len().min(count as usize);
        let mut slots: Vec<u64> = self.returned.drain(..again).collect();
        let remaining = self.slot_count() - self.slots_claimed;
        let granted = (count - again as u64).min(remaining);
        let first = self.slots_claimed;
        self.slots_claimed += granted;
        slots.extend((first..first + granted).map(|ordinal| self.slot_at(ordinal)));
        slots
    }

    /// Put a new episode on `lane`: scored on `slot`, or surplus when it is None.
    fn begin(&mut self, lane: usize, slot: Option<u64>, seeded: bool, now_ns: i64) -> i64 {
        let episode_id = self.next_episode_id;
        self.next_episode_id += 1;
        let seed = match slot {
            Some(slot) if seeded => Some(self.seed_for(slot)),
            _ => None,
        };
        let trial = slot.map_or(0, |slot| (self.trial_index_base + slot) as i64);
        let env_episode_id = self.lanes[lane].env_episode_id;
        self.lanes[lane] = Lane {
            state: LaneState::Running,
            episode_id,
            surplus: slot.is_none(),
            index: slot.map_or(-1, |slot| slot as i64),
            seed,
            trial,
            started_ns: now_ns,
            env_episode_id,
            ..Lane::vacant()
        };
        episode_id
    }

    fn start(&mut self, lanes: &[i64], overflow: Overflow, seeded: bool, now_ns: i64) -> Starts {
        let slots = self.claim_slots(lanes.len() as u64);
        let mut starts = Starts::default();
        for (position, &lane) in lanes.iter().enumerate() {
            let lane_index = lane as usize;
            if let Some(&slot) = slots.get(position) {
                starts.lanes.push(lane);
                starts
                    .episode_ids
                    .push(self.begin(lane_index, Some(slot), seeded, now_ns));
                starts.indices.push(slot as i64);
                starts.seeds.push(self.lanes[lane_index].seed);
                starts.trials.push(self.lanes[lane_index].trial);
            } else if overflow == Overflow::Surplus {
                starts.surplus_lanes.push(lane);
                starts
                    .surplus_episode_ids
                    .push(self.begin(lane_index, None, seeded, now_ns));
            } else {
                self.lanes[lane_index].state = LaneState::Idle;
            }
        }
        starts
    }

    fn require_vacant(&self, lane: usize, context: &str) -> Result<(), ArgError> {
        let held = &self.lanes[lane];
        match held.state {
            LaneState::Running | LaneState::Ended => Err(ArgError(format!(
                "lane {lane} {context}still holds {} episode {}: complete it before starting \
                 another",
                held.state.name(),
                held.episode_id
            ))),
            LaneState::Idle => Err(ArgError(format!(
                "lane {lane} {context}is idle: no slot was left for it, so it starts no other \
                 episode"
            ))),
            LaneState::Vacant => Ok(()),
        }
    }

    /// Start a seeded episode on each of `lanes`, claiming slots in order.
    pub fn start_episodes(
        &mut self,
        lanes: &[i64],
        now_ns: i64,
        overflow: Overflow,
    ) -> Result<Starts, ArgError> {
        self.marks.check_lanes(lanes)?;
        for &lane in lanes {
            self.require_vacant(lane as usize, "")?;
        }
        Ok(self.start(lanes, overflow, true, now_ns))
    }

    /// Start a fresh, env-seeded episode on each lane whose env-side episode id changed.
    pub fn observe_rolls(
        &mut self,
        lanes: &[i64],
        env_episode_ids: &[i64],
        now_ns: i64,
    ) -> Result<Starts, ArgError> {
        same_length("env_episode_ids", env_episode_ids.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        let mut rolled = Vec::new();
        for (&lane, &env_id) in lanes.iter().zip(env_episode_ids) {
            if let Some(previous) = self.lanes[lane as usize].env_episode_id {
                if previous != env_id {
                    self.require_vacant(
                        lane as usize,
                        &format!("rolled to env episode {env_id} but "),
                    )?;
                    rolled.push(lane);
                }
            }
        }
        for (&lane, &env_id) in lanes.iter().zip(env_episode_ids) {
            self.lanes[lane as usize].env_episode_id = Some(env_id);
        }
        Ok(self.start(&rolled, Overflow::Surplus, false, now_ns))
    }

    /// Account one env step for a group of running lanes; return the lanes that ended.
    pub fn record_step(
        &mut self,
        lanes: &[i64],
        rewards: &[f64],
        terminated: &[bool],
        truncated: &[bool],
        step_ns: &[i64],
        predict_ns: &[i64],
    ) -> Result<Vec<i64>, ArgError> {
        same_length("rewards", rewards.len(), lanes.len())?;
        same_length("terminated", terminated.len(), lanes.len())?;
        same_length("truncated", truncated.len(), lanes.len())?;
        same_length("step_ns", step_ns.len(), lanes.len())?;
        same_length("predict_ns", predict_ns.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        for (k, &lane) in lanes.iter().enumerate() {
            let state = self.lanes[lane as usize].state;
            if state != LaneState::Running {
                return Err(ArgError(format!(
                    "lane {lane} is {}, not running: only running lanes may be stepped",
                    state.name()
                )));
            }
            if step_ns[k] < 0 || predict_ns[k] < 0 {
                return Err(ArgError(format!(
                    "lane {lane} has step_ns={}, predict_ns={}: timings must be non-negative",
                    step_ns[k], predict_ns[k]
                )));
            }
        }

        let mut ended = Vec::new();
        for (k, &lane) in lanes.iter().enumerate() {
            let held = &mut self.lanes[lane as usize];
            held.steps += 1;
            held.reward += rewards[k];
            held.step_ns += step_ns[k] as i128;
            held.predict_ns += predict_ns[k] as i128;
            self.wasted_steps += held.surplus as u64;
            if terminated[k] || truncated[k] {
                held.state = LaneState::Ended;
                held.terminated = terminated[k];
                held.truncated = truncated[k];
                ended.push(lane);
            }
        }
        Ok(ended)
    }

    /// Close the ended episodes `episode_ids` on `lanes`; return the scored summaries.
    /// `digests[k]` is lane `lanes[k]`'s episode's `(reset, trajectory)` digests; none when
    /// `digests` is empty.
    pub fn complete_episodes(
        &mut self,
        lanes: &[i64],
        episode_ids: &[i64],
        success: &[Option<bool>],
        now_ns: i64,
        digests: &[Digests],
    ) -> Result<Vec<EpisodeSummary>, ArgError> {
        same_length("episode_ids", episode_ids.len(), lanes.len())?;
        same_length("success", success.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        for (&lane, &episode_id) in lanes.iter().zip(episode_ids) {
            let held = &self.lanes[lane as usize];
            if held.state == LaneState::Running && held.episode_id == episode_id {
                return Err(ArgError(format!(
                    "lane {lane} episode {episode_id} is still running: record_step has not seen it \
                     terminate or truncate"
                )));
            }
        }

        let digests = digests_of(digests, lanes.len())?;
        let mut completed = Vec::new();
        for (k, ((&lane, &episode_id), &outcome)) in
            lanes.iter().zip(episode_ids).zip(success).enumerate()
        {
            let lane = lane as usize;
            let held = &self.lanes[lane];
            if held.state != LaneState::Ended || held.episode_id != episode_id {
                self.ignored_completions += 1;
                continue;
            }
            if !held.surplus {
                let summary = summarize(lane, held, outcome, now_ns, None, digests(k));
                self.summaries.push(summary.clone());
                self.completed += 1;
                completed.push(summary);
            }
            if held.predicted {
                self.untold_model_ends.insert(episode_id);
            }
            let held = &mut self.lanes[lane];
            held.state = LaneState::Vacant;
            held.episode_id = -1;
            held.surplus = false;
            held.index = -1;
            held.seed = None;
            held.predicted = false;
        }
        Ok(completed)
    }

    /// Abandon the running episodes of `lanes`, whose env failed: `errors[k]` None gives the
    /// lane's slot back (claimed again first), a text records the episode failed with it.
    /// Returns the summaries of the episodes recorded failed (with `digests[k]`, the digests
    /// of lane `lanes[k]`'s steps so far; none when `digests` is empty).
    pub fn abandon_episodes(
        &mut self,
        lanes: &[i64],
        errors: &[Option<String>],
        now_ns: i64,
        digests: &[Digests],
    ) -> Result<Vec<EpisodeSummary>, ArgError> {
        same_length("errors", errors.len(), lanes.len())?;
        self.marks.check_lanes(lanes)?;
        for &lane in lanes {
            let state = self.lanes[lane as usize].state;
            if state != LaneState::Running {
                return Err(ArgError(format!(
                    "lane {lane} is {}, not running: only a running episode can be abandoned",
                    state.name()
                )));
            }
        }
        let digests = digests_of(digests, lanes.len())?;
        let mut failed = Vec::new();
        for (k, (&lane, error)) in lanes.iter().zip(errors).enumerate() {
            let lane = lane as usize;
            let held = &self.lanes[lane];
            if !held.surplus {
                match error {
                    None => self.returned.push(held.index as u64),
                    Some(error) => {
                        let error = Some(error.clone());
                        let summary = summarize(lane, held, None, now_ns, error, digests(k));
                        self.summaries.push(summary.clone());
                        self.completed += 1;
                        failed.push(summary);
                    }
                }
            }
            if held.predicted {
                self.untold_model_ends.insert(held.episode_id);
            }
            let held = &mut self.lanes[lane];
            held.state = LaneState::Vacant;
            held.episode_id = -1;
            held.surplus = false;
            held.index = -1;
            held.seed = None;
            held.predicted = false;
        }
        self.returned.sort_unstable();
        Ok(failed)
    }

    /// Note that the model predicted for the running episodes of `lanes`.
    pub fn mark_predicted(&mut self, lanes: &[i64]) -> Result<(), ArgError> {
        self.marks.check_lanes(lanes)?;
        for &lane in lanes {
            let state = self.lanes[lane as usize].state;
            if state != LaneState::Running {
                return Err(ArgError(format!(
                    "lane {lane} is {}, not running: the model cannot have predicted for it",
                    state.name()
                )));
            }
        }
        for &lane in lanes {
            self.lanes[lane as usize].predicted = true;
        }
        Ok(())
    }

    /// Of `episode_ids`, those whose end the model is owed; each only once.
    pub fn take_model_ends(&mut self, episode_ids: &[i64]) -> Vec<i64> {
        episode_ids
            .iter()
            .copied()
            .filter(|episode_id| self.untold_model_ends.remove(episode_id))
            .collect()
    }

    /// At teardown: every episode the model predicted on and was not told the end of.
    pub fn take_all_model_ends(&mut self) -> Vec<i64> {
        let mut owed = std::mem::take(&mut self.untold_model_ends);
        for held in self.lanes.iter_mut().filter(|held| held.predicted) {
            owed.insert(held.episode_id);
            held.predicted = false;
        }
        owed.into_iter().collect()
    }

    /// Lanes whose episode (scored or surplus) is being stepped, ascending.
    pub(crate) fn running(&self) -> Vec<i64> {
        self.lanes_in(LaneState::Running)
    }

    /// `running()` into `lanes` (cleared first), which keeps its allocation.
    pub(crate) fn running_into(&self, lanes: &mut Vec<i64>) {
        lanes.clear();
        lanes.extend(
            (0..self.num_lanes as i64)
                .filter(|&lane| self.lanes[lane as usize].state == LaneState::Running),
        );
    }

    /// The episode each of `lanes` holds (-1 for none). The lanes must be in range.
    pub(crate) fn episode_ids_of(&self, lanes: &[i64]) -> Vec<i64> {
        lanes
            .iter()
            .map(|&lane| self.lanes[lane as usize].episode_id)
            .collect()
    }

    /// The episode `lane` (in range) holds, -1 for none.
    #[inline]
    pub(crate) fn lane_episode_id(&self, lane: i64) -> i64 {
        self.lanes[lane as usize].episode_id
    }

    pub(crate) fn lane_count(&self) -> usize {
        self.num_lanes
    }

    /// The episode each of `lanes` holds (-1 for none), refusing a lane out of range or given
    /// twice, as `episode_ids` does.
    pub(crate) fn checked_episode_ids(&mut self, lanes: &[i64]) -> Result<Vec<i64>, ArgError> {
        self.marks.check_lanes(lanes)?;
        Ok(self.episode_ids_of(lanes))
    }

    /// The state of `lane` (in range).
    pub(crate) fn lane_state(&self, lane: usize) -> LaneState {
        self.lanes[lane].state
    }

    /// The steps `lane`'s (in range) episode has taken: its last episode's once it finished.
    #[inline]
    pub(crate) fn lane_steps(&self, lane: usize) -> i64 {
        self.lanes[lane].steps
    }

    /// When `lane`'s (in range) episode started: the start of its clock.
    #[inline]
    pub(crate) fn lane_started_ns(&self, lane: usize) -> i64 {
        self.lanes[lane].started_ns
    }

    /// The slot `lane`'s (in range) episode claimed, -1 for a surplus episode or none.
    pub(crate) fn lane_index(&self, lane: usize) -> i64 {
        self.lanes[lane].index
    }

    /// The reset seed of `lane`'s (in range) episode, None when the env chose its start.
    pub(crate) fn lane_seed(&self, lane: usize) -> Option<u64> {
        self.lanes[lane].seed
    }

    fn lanes_in(&self, state: LaneState) -> Vec<i64> {
        (0..self.num_lanes as i64)
            .filter(|&lane| self.lanes[lane as usize].state == state)
            .collect()
    }

    pub fn done(&self) -> bool {
        self.completed == self.slot_count()
    }
}

/// An episode's `(reset, trajectory)` digests, as the runner's `LaneDigests::episode` gives
/// them.
pub type Digests = (Option<u64>, Option<u64>);

/// Each lane's digests by position: none when `digests` is empty.
fn digests_of(
    digests: &[Digests],
    count: usize,
) -> Result<impl Fn(usize) -> Digests + '_, ArgError> {
    if !digests.is_empty() {
        same_length("digests", digests.len(), count)?;
    }
    Ok(move |k: usize| digests.get(k).copied().unwrap_or((None, None)))
}

fn summarize(
    lane: usize,
    held: &Lane,
    success: Option<bool>,
    now_ns: i64,
    error: Option<String>,
    digests: Digests,
) -> EpisodeSummary {
    let steps = held.steps;
    // An episode that failed before its first step has no per-step means: 0.
    let per_step_ms = match steps {
        0 => f64::INFINITY,
        _ => 1e6 * steps as f64,
    };
    let mean_ms = |total: i128| total as f64 / per_step_ms;
    EpisodeSummary {
        index: held.index,
        episode_id: held.episode_id,
        seed: held.seed,
        trial: held.trial,
        env_index: lane as i64,
        steps,
        reward: held.reward,
        terminated: held.terminated,
        truncated: held.truncated,
        success,
        duration_s: (now_ns as i128 - held.started_ns as i128) as f64 / 1e9,
        predict_ms: mean_ms(held.predict_ns),
        step_ms: mean_ms(held.step_ns),
        error,
        reset_digest: digests.0.map(hex_digest),
        trajectory_digest: digests.1.map(hex_digest),
    }
}

/// Iterate `values`, or a `ValueError` naming `name` when it is not iterable.
fn items<'py>(values: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyIterator>> {
    values
        .try_iter()
        .map_err(|_| match values.get_type().name() {
            Ok(kind) => {
                PyValueError::new_err(format!("{name} must be a sequence of integers, got {kind}"))
            }
            Err(err) => err,
        })
}

/// The slots to run: strictly increasing, each in `0..episodes-1`, at least one.
fn checked_indices(indices: &Bound<'_, PyAny>, episodes: u64) -> PyResult<Vec<u64>> {
    let mut checked: Vec<u64> = Vec::new();
    for (k, value) in items(indices, "indices")?.enumerate() {
        let index = u64_arg(&value?, &format!("indices[{k}]"))?;
        if index >= episodes {
            return Err(PyValueError::new_err(format!(
                "indices[{k}] is {index}, outside the slots 0..{}",
                episodes - 1
            )));
        }
        if let Some(&previous) = checked.last() {
            if index <= previous {
                return Err(PyValueError::new_err(format!(
                    "indices must be strictly increasing, but indices[{k}] is {index} after \
                     {previous}"
                )));
            }
        }
        checked.push(index);
    }
    if checked.is_empty() {
        return Err(PyValueError::new_err("indices must name at least one slot"));
    }
    Ok(checked)
}

/// What the runner needs of the ledger beyond the pure rules: the checked construction from
/// Python arguments, and the counters and state it reports.
impl RouteLedger {
    /// A ledger from the runner's Python arguments, each checked as the Python core checks
    /// it; warns (at the runner's caller) when ``seeds`` does not cover the budget.
    pub(crate) fn from_args(
        py: Python<'_>,
        num_lanes: &Bound<'_, PyAny>,
        episodes: &Bound<'_, PyAny>,
        seeds: Option<&Bound<'_, PyAny>>,
        base_seed: Option<&Bound<'_, PyAny>>,
        trial_index_base: Option<&Bound<'_, PyAny>>,
        indices: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let num_lanes = count_arg(num_lanes, "num_lanes")?;
        if num_lanes > MAX_LANES {
            return Err(PyValueError::new_err(format!(
                "num_lanes must be at most {MAX_LANES}, got {num_lanes}"
            )));
        }
        let episodes = count_arg(episodes, "episodes")?;
        let base_seed = base_seed.map_or(Ok(0), |value| u64_arg(value, "base_seed"))?;
        let trial_index_base =
            trial_index_base.map_or(Ok(0), |value| u64_arg(value, "trial_index_base"))?;
        // Indices and trials travel as int64 arrays.
        if (trial_index_base as u128) + (episodes as u128) - 1 > i64::MAX as u128 {
            return Err(PyValueError::new_err(format!(
                "trial_index_base + episodes must not exceed 2**63, got {trial_index_base} + {episodes}"
            )));
        }
        let mut listed = Vec::new();
        if let Some(seeds) = seeds {
            for (k, seed) in items(seeds, "seeds")?.enumerate() {
                listed.push(u64_arg(&seed?, &format!("seeds[{k}]"))?);
            }
            if (listed.len() as u64) < episodes {
                let message = format!(
                    "seeds has {} entries for {episodes} episodes: slots {}..{} reset with \
                     episode_seed(base_seed={base_seed}, trial_index_base + slot)",
                    listed.len(),
                    listed.len(),
                    episodes - 1
                );
                let message = CString::new(message).expect("the message holds no NUL byte");
                PyErr::warn(py, &user_warning(py), &message, 1)?;
            }
        }
        let indices = indices
            .map(|indices| checked_indices(indices, episodes))
            .transpose()?;
        Ok(RouteLedger::create(
            num_lanes as usize,
            episodes,
            listed,
            base_seed,
            trial_index_base,
            indices,
        ))
    }

    /// Lane-steps spent on surplus episodes.
    pub(crate) fn wasted_steps(&self) -> u64 {
        self.wasted_steps
    }

    /// Every scored episode completed so far, in completion order.
    pub(crate) fn summaries(&self) -> Vec<EpisodeSummary> {
        self.summaries.clone()
    }

    /// All observable state as plain Python values, for parity checks and debugging.
    pub(crate) fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let lanes = PyList::empty(py);
        for held in &self.lanes {
            let lane = PyDict::new(py);
            lane.set_item("state", held.state.name())?;
            lane.set_item("episode_id", held.episode_id)?;
            lane.set_item("surplus", held.surplus)?;
            lane.set_item("index", held.index)?;
            lane.set_item("seed", held.seed)?;
            lane.set_item("trial", held.trial)?;
            lane.set_item("steps", held.steps)?;
            lane.set_item("reward", held.reward)?;
            lane.set_item("terminated", held.terminated)?;
            lane.set_item("truncated", held.truncated)?;
            lane.set_item("predicted", held.predicted)?;
            lane.set_item("env_episode_id", held.env_episode_id)?;
            lanes.append(lane)?;
        }
        let summaries = PyList::empty(py);
        for summary in &self.summaries {
            summaries.append(summary.to_dict(py)?)?;
        }
        let snapshot = PyDict::new(py);
        snapshot.set_item("num_lanes", self.num_lanes)?;
        snapshot.set_item("episodes", self.episodes)?;
        snapshot.set_item("indices", self.indices.clone())?;
        snapshot.set_item("base_seed", self.base_seed)?;
        snapshot.set_item("trial_index_base", self.trial_index_base)?;
        snapshot.set_item("slots_claimed", self.slots_claimed)?;
        snapshot.set_item("returned_slots", self.returned.clone())?;
        snapshot.set_item("completed", self.completed)?;
        snapshot.set_item("wasted_steps", self.wasted_steps)?;
        snapshot.set_item("ignored_completions", self.ignored_completions)?;
        snapshot.set_item("next_episode_id", self.next_episode_id)?;
        snapshot.set_item(
            "untold_model_ends",
            self.untold_model_ends.iter().collect::<Vec<_>>(),
        )?;
        snapshot.set_item("lanes", lanes)?;
        snapshot.set_item("summaries", summaries)?;
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: bool = false;

    fn ledger(num_lanes: usize, episodes: u64) -> RouteLedger {
        RouteLedger::create(num_lanes, episodes, Vec::new(), 0, 0, None)
    }

    /// Step `lanes` once with reward 1, ending the ones in `ending`.
    fn step(ledger: &mut RouteLedger, lanes: &[i64], ending: &[i64]) -> Vec<i64> {
        let done: Vec<bool> = lanes.iter().map(|lane| ending.contains(lane)).collect();
        let n = lanes.len();
        ledger
            .record_step(
                lanes,
                &vec![1.0; n],
                &done,
                &vec![F; n],
                &vec![10; n],
                &vec![4; n],
            )
            .unwrap()
    }

    fn complete(ledger: &mut RouteLedger, lanes: &[i64], ids: &[i64]) -> Vec<EpisodeSummary> {
        ledger
            .complete_episodes(lanes, ids, &vec![None; lanes.len()], 100, &[])
            .unwrap()
    }

    #[test]
    fn slots_are_claimed_in_start_order_and_lanes_past_the_budget_go_idle() {
        let mut ledger = ledger(4, 2);
        let starts = ledger
            .start_episodes(&[3, 1, 0, 2], 0, Overflow::Idle)
            .unwrap();
        assert_eq!(starts.lanes, vec![3, 1]);
        assert_eq!(starts.indices, vec![0, 1]);
        assert_eq!(
            starts.seeds,
            vec![Some(derive_seed(0, 0)), Some(derive_seed(0, 1))]
        );
        assert!(starts.surplus_lanes.is_empty());
        assert_eq!(ledger.lanes_in(LaneState::Idle), vec![0, 2]);
    }

    #[test]
    fn a_ledger_with_indices_claims_only_those_slots_in_order() {
        let mut ledger = RouteLedger::create(2, 6, Vec::new(), 3, 0, Some(vec![1, 4, 5]));
        let starts = ledger.start_episodes(&[0, 1], 0, Overflow::Idle).unwrap();
        assert_eq!(starts.indices, vec![1, 4]);
        assert_eq!(
            starts.seeds,
            vec![Some(derive_seed(3, 1)), Some(derive_seed(3, 4))]
        );
        step(&mut ledger, &[0, 1], &[0, 1]);
        complete(&mut ledger, &[0, 1], &[0, 1]);
        let last = ledger.start_episodes(&[1, 0], 0, Overflow::Idle).unwrap();
        assert_eq!(last.indices, vec![5]);
        assert_eq!(ledger.lanes_in(LaneState::Idle), vec![0]);
        step(&mut ledger, &[1], &[1]);
        complete(&mut ledger, &[1], &[2]);
        assert!(ledger.done());
    }

    #[test]
    fn an_idle_lane_starts_no_other_episode() {
        let mut ledger = ledger(2, 1);
        ledger.start_episodes(&[0, 1], 0, Overflow::Idle).unwrap();
        let err = ledger.start_episodes(&[1], 0, Overflow::Idle).unwrap_err();
        assert!(err.0.starts_with("lane 1 is idle"));
    }

    #[test]
    fn listed_seeds_come_first_then_derived_ones_with_the_trial_offset() {
        let mut ledger = RouteLedger::create(3, 3, vec![11, 12], 5, 100, None);
        let starts = ledger
            .start_episodes(&[0, 1, 2], 0, Overflow::Idle)
            .unwrap();
        assert_eq!(
            starts.seeds,
            vec![Some(11), Some(12), Some(derive_seed(5, 102))]
        );
        assert_eq!(starts.trials, vec![100, 101, 102]);
    }

    #[test]
    fn surplus_episodes_are_stepped_counted_as_waste_and_never_scored() {
        let mut ledger = ledger(2, 1);
        ledger
            .start_episodes(&[0, 1], 0, Overflow::Surplus)
            .unwrap();
        step(&mut ledger, &[0, 1], &[]);
        let ended = step(&mut ledger, &[0, 1], &[0, 1]);
        assert_eq!(ended, vec![0, 1]);
        let summaries = complete(&mut ledger, &[0, 1], &[0, 1]);
        assert_eq!(summaries.len(), 1);
        assert_eq!(
            (summaries[0].index, summaries[0].steps, summaries[0].reward),
            (0, 2, 2.0)
        );
        assert_eq!(ledger.wasted_steps, 2);
        assert!(ledger.done());
    }

    #[test]
    fn stale_and_duplicate_completions_are_ignored_and_counted() {
        let mut ledger = ledger(1, 3);
        ledger.start_episodes(&[0], 0, Overflow::Idle).unwrap();
        step(&mut ledger, &[0], &[0]);
        assert_eq!(complete(&mut ledger, &[0], &[0]).len(), 1);
        assert!(complete(&mut ledger, &[0], &[0]).is_empty());
        ledger.start_episodes(&[0], 0, Overflow::Idle).unwrap();
        step(&mut ledger, &[0], &[0]);
        assert!(complete(&mut ledger, &[0], &[0]).is_empty());
        assert_eq!(ledger.ignored_completions, 2);
        assert_eq!(ledger.completed, 1);
        assert_eq!(complete(&mut ledger, &[0], &[1])[0].index, 1);
    }

    #[test]
    fn rolls_start_episodes_only_where_the_env_episode_id_changed() {
        let mut ledger = ledger(2, 5);
        ledger
            .start_episodes(&[0, 1], 0, Overflow::Surplus)
            .unwrap();
        let baseline = ledger.observe_rolls(&[0, 1], &[7, 7], 0).unwrap();
        assert!(baseline.lanes.is_empty());
        step(&mut ledger, &[0, 1], &[1]);
        complete(&mut ledger, &[1], &[1]);
        let rolled = ledger.observe_rolls(&[0, 1], &[7, 8], 0).unwrap();
        assert_eq!(
            (rolled.lanes, rolled.indices, rolled.seeds),
            (vec![1], vec![2], vec![None])
        );
        let err = ledger.observe_rolls(&[0], &[9], 0).unwrap_err();
        assert!(err
            .0
            .contains("lane 0 rolled to env episode 9 but still holds running"));
    }

    #[test]
    fn each_model_end_is_owed_exactly_once_including_at_teardown() {
        let mut ledger = ledger(2, 4);
        ledger.start_episodes(&[0, 1], 0, Overflow::Idle).unwrap();
        ledger.mark_predicted(&[0, 1]).unwrap();
        step(&mut ledger, &[0, 1], &[0]);
        complete(&mut ledger, &[0], &[0]);
        assert_eq!(ledger.take_model_ends(&[0, 1]), vec![0]);
        assert!(ledger.take_model_ends(&[0]).is_empty());
        assert_eq!(ledger.take_all_model_ends(), vec![1]);
        assert!(ledger.take_all_model_ends().is_empty());
    }

    #[test]
    fn bad_lanes_and_states_are_refused_without_changing_anything() {
        let mut ledger = ledger(2, 2);
        ledger.start_episodes(&[0], 0, Overflow::Idle).unwrap();
        let before = format!("{:?}", ledger.lanes);
        let n = |lanes: &[i64]| lanes.len();
        let err = |ledger: &mut RouteLedger, lanes: &[i64]| {
            ledger
                .record_step(
                    lanes,
                    &vec![0.0; n(lanes)],
                    &vec![F; n(lanes)],
                    &vec![F; n(lanes)],
                    &vec![0; n(lanes)],
                    &vec![0; n(lanes)],
                )
                .unwrap_err()
                .0
        };
        assert_eq!(
            err(&mut ledger, &[2]),
            "lane 2 is out of range: this route has lanes 0..1"
        );
        assert_eq!(err(&mut ledger, &[0, 0]), "lane 0 appears twice in lanes");
        assert_eq!(
            err(&mut ledger, &[0, 1]),
            "lane 1 is vacant, not running: only running lanes may be stepped"
        );
        assert_eq!(format!("{:?}", ledger.lanes), before);
        let running = ledger
            .complete_episodes(&[0], &[0], &[None], 0, &[])
            .unwrap_err();
        assert!(running.0.starts_with("lane 0 episode 0 is still running"));
        let restart = ledger.start_episodes(&[0], 0, Overflow::Idle).unwrap_err();
        assert!(restart
            .0
            .starts_with("lane 0 still holds running episode 0"));
    }
}
