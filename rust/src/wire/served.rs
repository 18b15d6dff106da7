//! A served env's per-lane work: `ServedSteps` steps in-process lanes, each lane's env with its
//! row of an action batch, and gives the results in the form a `StepResponse` carries them;
//! `ServedEpisodes` keeps which lanes run an episode, and each one's steps and return.
//!
//! Mirrors `python/rlmesh/_pycore/wire/served.py`, the specification. One thing is this core's
//! own: where every observation is an array of exactly the observation leaf's dtype and shape
//! and passes its check, their bytes are copied here rather than by `encode`, which gives the
//! same bytes. Anything else (another dtype, a list, a value outside the space) goes to
//! `encode`, which names what is wrong.

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::args::{array_bytes, lanes_arg, Dtype};
use crate::rounds::{env_failure, lane_actions, read_column, read_flag, read_reward, unpack_step};

/// What every value of the observation leaf must pass (the server's value checks).
enum Check {
    Nothing,
    /// No NaN element (a float leaf).
    NoNan,
    /// Integers in `[low, high)` (a `Discrete`, or `MultiBinary` as `[0, 2)`).
    Range {
        low: i128,
        high: i128,
    },
}

/// The observation space's one numeric leaf, as this core writes its bytes.
struct Layout {
    dtype: Py<PyArrayDescr>,
    shape: Vec<usize>,
    /// numpy's kind: `b'f'`, `b'i'`, `b'u'` or `b'b'`.
    kind: u8,
    itemsize: usize,
    check: Check,
}

impl Layout {
    /// The layout `observation` (`(dtype, shape, check)`) names, or None where this core has no
    /// way to write it (a byte order not this machine's, a kind other than bool, int or float).
    fn new(observation: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let py = observation.py();
        let (dtype, shape, check): (Bound<'_, PyAny>, Vec<usize>, Bound<'_, PyAny>) =
            observation.extract()?;
        let check = if check.is_none() {
            Check::Nothing
        } else if check.extract::<String>().is_ok_and(|text| text == "nan") {
            Check::NoNan
        } else {
            let (low, high): (i128, i128) = check.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "observation check must be None, \"nan\" or (low, high), got {check}"
                ))
            })?;
            Check::Range { low, high }
        };
        let dtype = py
            .import("numpy")?
            .getattr("dtype")?
            .call1((dtype,))?
            .cast_into::<PyArrayDescr>()?;
        let (kind, itemsize) = (dtype.kind(), dtype.itemsize());
        // The wire is little-endian: an array's bytes are the wire's only on such a machine,
        // and only for a dtype not marked big-endian.
        let little = cfg!(target_endian = "little") && dtype.byteorder() != b'>';
        if !little || !b"fiub".contains(&kind) {
            return Ok(None);
        }
        Ok(Some(Layout {
            dtype: dtype.unbind(),
            shape,
            kind,
            itemsize,
            check,
        }))
    }

    /// The bytes of `observations` stacked, or None where one is not an array of this dtype
    /// and shape or a value breaks the check.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        observations: &[Bound<'py, PyAny>],
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let dtype = self.dtype.bind(py);
        let row_bytes = self.itemsize * self.shape.iter().product::<usize>();
        let mut buffer = Vec::with_capacity(observations.len() * row_bytes);
        for observation in observations {
            let Ok(array) = observation.cast::<PyUntypedArray>() else {
                return Ok(None);
            };
            if array.shape() != self.shape.as_slice() || !array.dtype().is_equiv_to(dtype) {
                return Ok(None);
            }
            if array.is_c_contiguous() {
                // SAFETY: the array lives and no Python code runs while the slice is read.
                buffer.extend_from_slice(unsafe { array_bytes(array) });
            } else {
                let bytes = observation.call_method0("tobytes")?;
                buffer.extend_from_slice(bytes.cast::<PyBytes>()?.as_bytes());
            }
        }
        if !self.passes(&buffer) {
            return Ok(None);
        }
        Ok(Some(PyBytes::new(py, &buffer)))
    }

    fn passes(&self, bytes: &[u8]) -> bool {
        let size = self.itemsize;
        match self.check {
            Check::Nothing => true,
            Check::NoNan => match size {
                2 => bytes.chunks_exact(2).all(|b| {
                    let bits = u16::from_le_bytes([b[0], b[1]]);
                    bits & 0x7c00 != 0x7c00 || bits & 0x03ff == 0
                }),
                4 => bytes
                    .chunks_exact(4)
                    .all(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_nan()),
                8 => bytes.chunks_exact(8).all(|b| {
                    let mut word = [0; 8];
                    word.copy_from_slice(b);
                    !f64::from_le_bytes(word).is_nan()
                }),
                _ => false,
            },
            Check::Range { low, high } => bytes.chunks_exact(size).all(|b| {
                let value = match (self.kind, size) {
                    (b'i', 1) => i128::from(b[0] as i8),
                    (b'i', 2) => i128::from(i16::from_le_bytes([b[0], b[1]])),
                    (b'i', 4) => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    (b'i', 8) => {
                        let mut word = [0; 8];
                        word.copy_from_slice(b);
                        i128::from(i64::from_le_bytes(word))
                    }
                    (b'u' | b'b', _) => {
                        let mut word = [0; 8];
                        word[..size].copy_from_slice(b);
                        i128::from(u64::from_le_bytes(word))
                    }
                    _ => return false, // a float leaf with a range: `encode` decides
                };
                low <= value && value < high
            }),
        }
    }
}

/// The steps an env server takes for its `StepRequest`s, over lanes whose envs' `step` it
/// holds (`Lanes.env_steps`).
#[pyclass(module = "rlmesh._core")]
pub struct ServedSteps {
    env_steps: Py<PyAny>,
    env_name: Py<PyAny>,
    encode: Py<PyAny>,
    layout: Option<Layout>,
}

/// What `step` returns: `(observation leaves, rewards, terminated, truncated, infos)`.
type Stepped<'py> = (
    Bound<'py, PyAny>,
    Vec<f64>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyList>,
);

#[pymethods]
impl ServedSteps {
    #[new]
    #[pyo3(signature = (env_steps, env_name, encode, observation=None))]
    fn py_new(
        env_steps: Bound<'_, PyAny>,
        env_name: Bound<'_, PyAny>,
        encode: Bound<'_, PyAny>,
        observation: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let layout = match observation {
            Some(observation) if !observation.is_none() => Layout::new(observation)?,
            _ => None,
        };
        Ok(ServedSteps {
            env_steps: env_steps.unbind(),
            env_name: env_name.unbind(),
            encode: encode.unbind(),
            layout,
        })
    }

    /// Step `lanes` (`[K]` int64: distinct, in range) with `actions`, batched as `Lanes.step`
    /// takes them; see the Python core.
    fn step<'py>(
        &self,
        py: Python<'py>,
        lanes: &Bound<'py, PyAny>,
        actions: &Bound<'py, PyAny>,
    ) -> PyResult<Stepped<'py>> {
        let lane_list = lanes_arg(lanes)?;
        let lane_list = lane_list.as_slice()?;
        let env_steps = self.env_steps.bind(py);
        let count = lane_list.len();
        let actions = lane_actions(actions, count, &mut Vec::new())?;
        let mut observations = Vec::with_capacity(count);
        let (mut rewards, mut terminated, mut truncated) = (
            Vec::with_capacity(count),
            Vec::with_capacity(count),
            Vec::with_capacity(count),
        );
        let infos = PyList::empty(py);
        for (k, &lane) in lane_list.iter().enumerate() {
            let stepped = (|| {
                let step = env_steps.get_item(lane)?;
                unpack_step(step.call1((actions.get(k)?,))?)
            })();
            let [observation, reward, term, trunc, info] = match stepped {
                Ok(result) => result,
                Err(err) if err.is_instance_of::<PyException>(py) => {
                    return Err(env_failure(
                        py,
                        self.env_name.bind(py),
                        "step",
                        err,
                        Some(lane),
                    )?)
                }
                Err(err) => return Err(err),
            };
            observations.push(observation);
            rewards.push(reward);
            terminated.push(term);
            truncated.push(trunc);
            infos.append(info)?;
        }
        let leaves = match &self.layout {
            Some(layout) => layout.encode(py, &observations)?,
            None => None,
        };
        let leaves = match leaves {
            Some(bytes) => PyList::new(py, [bytes])?.into_any(),
            None => self
                .encode
                .bind(py)
                .call1((PyList::new(py, &observations)?, lanes))?,
        };
        let mut values = Vec::with_capacity(count);
        read_column(
            &rewards,
            Dtype::Float64,
            "rewards",
            read_reward,
            &mut values,
        )?;
        Ok((
            leaves,
            values,
            flag_bytes(py, &terminated, "terminated")?,
            flag_bytes(py, &truncated, "truncated")?,
            infos,
        ))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("ServedSteps({})", self.env_name.bind(py).str()?))
    }
}

/// Flags as a mask of one byte per value, 1 where set.
fn flag_bytes<'py>(
    py: Python<'py>,
    flags: &[Bound<'py, PyAny>],
    name: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut values = Vec::with_capacity(flags.len());
    read_column(flags, Dtype::Bool, name, read_flag, &mut values)?;
    let mask: Vec<u8> = values.into_iter().map(u8::from).collect();
    Ok(PyBytes::new(py, &mask))
}

/// Which of a served env's lanes run an episode, and its steps and return so far.
#[pyclass(module = "rlmesh._core")]
pub struct ServedEpisodes {
    running: Vec<bool>,
    steps: Vec<i64>,
    returns: Vec<f64>,
}

impl ServedEpisodes {
    fn checked(&self, lanes: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        let lanes = lanes_arg(lanes)?;
        lanes
            .as_slice()?
            .iter()
            .map(|&lane| self.lane(lane))
            .collect()
    }

    fn lane(&self, lane: i64) -> PyResult<usize> {
        match usize::try_from(lane) {
            Ok(index) if index < self.running.len() => Ok(index),
            _ => Err(PyValueError::new_err(format!(
                "lane {lane} is not a lane of this server (0..{})",
                self.running.len() as i64 - 1
            ))),
        }
    }
}

#[pymethods]
impl ServedEpisodes {
    #[new]
    fn py_new(num_lanes: usize) -> Self {
        ServedEpisodes {
            running: vec![false; num_lanes],
            steps: vec![0; num_lanes],
            returns: vec![0.0; num_lanes],
        }
    }

    fn start(&mut self, lanes: &Bound<'_, PyAny>) -> PyResult<()> {
        for lane in self.checked(lanes)? {
            self.running[lane] = true;
            self.steps[lane] = 0;
            self.returns[lane] = 0.0;
        }
        Ok(())
    }

    fn not_running(&self, lanes: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        let checked = self.checked(lanes)?;
        Ok(checked.into_iter().filter(|&l| !self.running[l]).collect())
    }

    fn add(&mut self, lanes: &Bound<'_, PyAny>, rewards: Vec<f64>) -> PyResult<()> {
        let checked = self.checked(lanes)?;
        if rewards.len() != checked.len() {
            return Err(PyValueError::new_err(format!(
                "{} rewards for {} lanes",
                rewards.len(),
                checked.len()
            )));
        }
        for (lane, reward) in checked.into_iter().zip(rewards) {
            self.steps[lane] += 1;
            self.returns[lane] += reward;
        }
        Ok(())
    }

    fn finish(&mut self, lane: i64) -> PyResult<(i64, f64)> {
        let lane = self.lane(lane)?;
        self.running[lane] = false;
        Ok((self.steps[lane], self.returns[lane]))
    }

    fn running_lanes(&self) -> Vec<usize> {
        (0..self.running.len())
            .filter(|&l| self.running[l])
            .collect()
    }

    fn stop(&mut self) {
        self.running.fill(false);
    }

    fn __repr__(&self) -> String {
        format!("ServedEpisodes(num_lanes={})", self.running.len())
    }
}
