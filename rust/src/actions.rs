//! Bringing the model's batched action into the action space, one leaf of the space at a time.
//!
//! Mirrors `python/rlmesh/_pycore/actions.py` name for name; that file is the specification
//! (the rules per kind, their order, the messages). Here each leaf's checks and conversion run
//! in one pass over the rows in Rust, reading the model's array as float64 and writing the
//! action straight into a numpy array of the space's dtype. The Python objects (the dicts of a
//! Dict action space, numpy's conversion of what the model returned) are handled at the edge.

use numpy::npyffi::PY_ARRAY_API;
use numpy::{
    dtype, Element, IxDyn, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyMapping, PyString, PyTuple};

use crate::args::{path_text, type_name, vector, ArgError, Dtype};
use crate::rotations::Encoding;

pyo3::import_exception!(rlmesh.errors, ModelOutputError);

/// How a message names the lane of row `k` of the model's output: "lane 3", or from the round
/// runner "lane 3 (episode index 7, step 12)".
pub type LaneText<'a> = &'a dyn Fn(usize) -> String;

/// A model returned a bad action: becomes a `rlmesh.errors.ModelOutputError` with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputError(pub String);

impl From<OutputError> for PyErr {
    fn from(err: OutputError) -> PyErr {
        ModelOutputError::new_err(err.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Box,
    Discrete,
    MultiDiscrete,
    MultiBinary,
}

/// The leaf kinds with their names in a plan and in messages, in the order messages list them.
const KIND_NAMES: [(&str, &str, Kind); 4] = [
    ("box", "Box", Kind::Box),
    ("discrete", "Discrete", Kind::Discrete),
    ("multi_discrete", "MultiDiscrete", Kind::MultiDiscrete),
    ("multi_binary", "MultiBinary", Kind::MultiBinary),
];
/// The numpy dtype kinds a model's action may hold ("b" bool, "i" int, "u" uint, "f" float).
const NUMERIC_KINDS: &[u8] = b"biuf";
const INTEGRAL_KINDS: &[u8] = b"biu";

/// The output dtypes written directly; any other goes through float64 and numpy's `astype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutDtype {
    F64,
    F32,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    Other,
}

impl OutDtype {
    fn from_name(name: &str) -> Self {
        match name {
            "float64" => OutDtype::F64,
            "float32" => OutDtype::F32,
            "int64" => OutDtype::I64,
            "int32" => OutDtype::I32,
            "int16" => OutDtype::I16,
            "int8" => OutDtype::I8,
            "uint64" => OutDtype::U64,
            "uint32" => OutDtype::U32,
            "uint16" => OutDtype::U16,
            "uint8" => OutDtype::U8,
            "bool" => OutDtype::Bool,
            _ => OutDtype::Other,
        }
    }
}

/// A float64 value cast into an output element, as numpy's `astype` does for the values that
/// reach it (finite, and integral within the dtype's range for the integer dtypes).
pub trait FromF64: Element + Copy {
    fn from_f64(value: f64) -> Self;
}

macro_rules! from_f64_by_as {
    ($($t:ty),*) => {
        $(impl FromF64 for $t {
            fn from_f64(value: f64) -> Self {
                value as $t
            }
        })*
    };
}
from_f64_by_as!(f64, f32, i64, i32, i16, i8, u64, u32, u16, u8);

impl FromF64 for bool {
    fn from_f64(value: f64) -> Self {
        value != 0.0
    }
}

/// Python's `repr(float)`: the shortest digits that read back to `value`, positional when the
/// decimal exponent is in -4..15, else scientific with a signed exponent of at least two digits.
pub fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // `{:e}` gives the same shortest round-trip digits, as "-d.ddde-x".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("the exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1; // digits before the decimal point
    let body = if !(-4 < point && point <= 16) {
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        format!("{first}{fraction}e{exponent_sign}{:02}", exponent.abs())
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

fn shape_text(shape: &[usize]) -> String {
    let sizes: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", sizes.join(","))
}

fn count_text(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Whether one row of the model's output is one action of `shape`: the same shape, or for a
/// leaf of one value, a scalar or a one-element vector either way.
fn row_shape_fits(row_shape: &[usize], shape: &[usize]) -> bool {
    if row_shape == shape {
        return true;
    }
    shape.len() <= 1
        && row_shape.len() <= 1
        && shape.iter().product::<usize>() == 1
        && row_shape.iter().product::<usize>() == 1
}

/// Element `element` (row-major) of an action of `shape`: `[3]`, `[1, 2]`, `""`.
fn index_text(element: usize, shape: &[usize]) -> String {
    if shape.is_empty() {
        return String::new();
    }
    let mut index = vec![0; shape.len()];
    let mut rest = element;
    for (axis, &size) in shape.iter().enumerate().rev() {
        index[axis] = rest % size;
        rest /= size;
    }
    let parts: Vec<String> = index.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// A value as the model gave it: an int when its array held integers, else a float.
fn value_text(value: f64, integral_input: bool) -> String {
    if integral_input {
        // Integers read as float64 are integral and far inside i128.
        (value as i128).to_string()
    } else {
        float_repr(value)
    }
}

/// Box bounds and mapping, flat over the action's elements.
#[derive(Debug, Clone)]
pub struct BoxRule {
    pub low: Vec<f64>,
    pub high: Vec<f64>,
    pub span: Vec<f64>,
    pub rescale: Option<(f64, f64)>,
    pub clip: bool,
}

/// One `ActionLeafPlan`, prepared: flat float64 bounds and the texts messages use.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub path: Vec<String>,
    pub r#where: String,
    pub kind: Kind,
    pub shape: Vec<usize>,
    pub size: usize,
    pub dtype: String,
    out_dtype: OutDtype,
    pub label: String,
    /// An integer (or bool) output holds exactly the integers `dtype_min..dtype_max`: both
    /// ends, and `dtype_max + 1`, are powers of two or zero, so float64 comparisons are exact.
    pub integer: bool,
    pub dtype_min: i128,
    pub dtype_max: i128,
    pub box_rule: Option<BoxRule>,
    pub start: i64,
    pub n: i64,
    pub lowest: Vec<i64>,
    pub stop: Vec<i64>,
    /// A role-based layout the model's rows go through before the Box conversion.
    pub layout: Option<Layout>,
}

/// The pure-Rust leaf: every rule, no Python objects.
impl Leaf {
    #[cold]
    #[inline(never)]
    fn fail(
        &self,
        lane_text: LaneText<'_>,
        row: usize,
        element: usize,
        shown: String,
        expected: &str,
    ) -> OutputError {
        OutputError(format!(
            "{}: {}{} is {shown}; expected {expected} for {}",
            lane_text(row),
            self.r#where,
            index_text(element, &self.shape),
            self.label
        ))
    }

    /// Check and convert `values` (`[K, size]` float64, row-major) into `out` (`[K, size]`).
    /// The first bad element in row-major order is reported with the first rule it breaks, as
    /// in the Python core, its row's lane named by `lane_text`.
    pub fn convert<T: FromF64>(
        &self,
        values: &[f64],
        lane_text: LaneText<'_>,
        integral_input: bool,
        out: &mut [T],
    ) -> Result<(), OutputError> {
        if self.size == 0 {
            return Ok(());
        }
        match self.kind {
            Kind::Box => {
                let rule = self.box_rule.as_ref().expect("a box leaf has a box rule");
                if self.integer {
                    return self.convert_integer_box(rule, values, lane_text, integral_input, out);
                }
                self.check_each(
                    values,
                    lane_text,
                    integral_input,
                    |_, x| x.is_finite(),
                    |_| "a finite number".to_string(),
                )?;
                // Every value is finite, so the mapping cannot fail: a loop without a check.
                let bounds = rule.low.iter().zip(&rule.high).zip(&rule.span);
                for (row, out) in values
                    .chunks_exact(self.size)
                    .zip(out.chunks_exact_mut(self.size))
                {
                    for ((x, out), ((low, high), span)) in row.iter().zip(out).zip(bounds.clone()) {
                        *out = T::from_f64(rule.map(*x, *low, *high, *span, false));
                    }
                }
                return Ok(());
            }
            Kind::Discrete => {
                let stop = self.start as i128 + self.n as i128;
                let (lowest, stop_f) = (self.start as f64, stop as f64);
                self.check_each(
                    values,
                    lane_text,
                    integral_input,
                    |_, x| integer_in(x, lowest, stop_f),
                    |_| format!("an integer in {}..{}", self.start, stop - 1),
                )?;
            }
            Kind::MultiDiscrete => {
                let ok = |element: usize, x: f64| {
                    integer_in(x, self.lowest[element] as f64, self.stop[element] as f64)
                };
                self.check_each(values, lane_text, integral_input, ok, |element| {
                    let (lowest, stop) = (self.lowest[element], self.stop[element] as i128);
                    format!("an integer in {lowest}..{}", stop - 1)
                })?;
            }
            Kind::MultiBinary => {
                self.check_each(
                    values,
                    lane_text,
                    integral_input,
                    |_, x| x == 0.0 || x == 1.0,
                    |_| "0 or 1".to_string(),
                )?;
            }
        }
        // Checked integers in range: the cast is exact.
        for (out, &x) in out.iter_mut().zip(values) {
            *out = T::from_f64(x);
        }
        Ok(())
    }

    /// The first value (row-major) that `ok(element, value)` refuses, as the error that says
    /// `expected(element)`.
    fn check_each(
        &self,
        values: &[f64],
        lane_text: LaneText<'_>,
        integral_input: bool,
        ok: impl Fn(usize, f64) -> bool,
        expected: impl Fn(usize) -> String,
    ) -> Result<(), OutputError> {
        for (row, items) in values.chunks_exact(self.size).enumerate() {
            for (element, &x) in items.iter().enumerate() {
                if !ok(element, x) {
                    let shown = value_text(x, integral_input);
                    return Err(self.fail(lane_text, row, element, shown, &expected(element)));
                }
            }
        }
        Ok(())
    }

    /// An integer Box: per element, finite, then mapped (rounded after a rescale), then an
    /// integer its dtype holds.
    fn convert_integer_box<T: FromF64>(
        &self,
        rule: &BoxRule,
        values: &[f64],
        lane_text: LaneText<'_>,
        integral_input: bool,
        out: &mut [T],
    ) -> Result<(), OutputError> {
        let (dtype_min, dtype_stop) = (self.dtype_min as f64, (self.dtype_max + 1) as f64);
        let rows = values
            .chunks_exact(self.size)
            .zip(out.chunks_exact_mut(self.size));
        for (row, (items, out)) in rows.enumerate() {
            for (element, (&x, out)) in items.iter().zip(out).enumerate() {
                if !x.is_finite() {
                    let shown = value_text(x, integral_input);
                    return Err(self.fail(lane_text, row, element, shown, "a finite number"));
                }
                let (low, high) = (rule.low[element], rule.high[element]);
                let y = rule.map(x, low, high, rule.span[element], true);
                if y != y.floor() {
                    let shown = value_text(x, integral_input);
                    return Err(self.fail(lane_text, row, element, shown, "an integer"));
                }
                if y < dtype_min || y >= dtype_stop {
                    let mut shown = value_text(x, integral_input);
                    if rule.rescale.is_some() {
                        shown = format!("{shown} ({} after rescale)", float_repr(y));
                    }
                    let held = format!(
                        "an integer {} holds ({}..{})",
                        self.dtype, self.dtype_min, self.dtype_max
                    );
                    return Err(self.fail(lane_text, row, element, shown, &held));
                }
                *out = T::from_f64(y);
            }
        }
        Ok(())
    }
}

impl BoxRule {
    /// A finite value rescaled (and rounded to an integer for an integer dtype), then clipped;
    /// the operations in the Python core's order, so the float64 results are identical.
    #[inline(always)]
    fn map(&self, x: f64, low: f64, high: f64, span: f64, integer: bool) -> f64 {
        let mut y = x;
        if let Some((lo, hi)) = self.rescale {
            y = low + (x - lo) * span / (hi - lo);
            if integer {
                // A linear map onto integers lands between them: round half to even.
                y = y.round_ties_even();
            }
        }
        if self.clip {
            // np.clip, for the finite values that reach it.
            y = if y < low {
                low
            } else if y > high {
                high
            } else {
                y
            };
        }
        y
    }
}

/// Whether `x` is an integer in `lowest..stop-1` (compared in float64; NaN is not).
#[inline]
fn integer_in(x: f64, lowest: f64, stop: f64) -> bool {
    x == x.floor() && x >= lowest && x < stop
}

/// The action space's shape while it is being built from the leaves' paths.
enum RawNode {
    Leaf(usize),
    Dict(Vec<(String, RawNode)>),
}

fn overlap(leaf: &Leaf) -> ArgError {
    ArgError(format!(
        "{} overlaps another action leaf: each leaf needs its own path",
        leaf.r#where
    ))
}

/// The action space's shape: a leaf's index, or a dict of subtrees in the space's order.
fn build_tree(leaves: &[Leaf]) -> Result<RawNode, ArgError> {
    let mut root: Option<RawNode> = None;
    for (index, leaf) in leaves.iter().enumerate() {
        let Some((last, parents)) = leaf.path.split_last() else {
            if root.is_some() {
                return Err(overlap(leaf));
            }
            root = Some(RawNode::Leaf(index));
            continue;
        };
        let mut node = match root.get_or_insert_with(|| RawNode::Dict(Vec::new())) {
            RawNode::Leaf(_) => return Err(overlap(leaf)),
            RawNode::Dict(entries) => entries,
        };
        for key in parents {
            let position = match node.iter().position(|(name, _)| name == key) {
                Some(position) => position,
                None => {
                    node.push((key.clone(), RawNode::Dict(Vec::new())));
                    node.len() - 1
                }
            };
            node = match &mut node[position].1 {
                RawNode::Leaf(_) => return Err(overlap(leaf)),
                RawNode::Dict(entries) => entries,
            };
        }
        if node.iter().any(|(name, _)| name == last) {
            return Err(overlap(leaf));
        }
        node.push((last.clone(), RawNode::Leaf(index)));
    }
    Ok(root.unwrap_or(RawNode::Dict(Vec::new())))
}

/// The tree with what the Python objects and messages need at each dict.
enum Node {
    Leaf(usize),
    Dict(DictNode),
}

struct DictNode {
    r#where: String,
    keys_text: String,
    names: Vec<String>,
    keys: Vec<Py<PyString>>,
    children: Vec<Node>,
}

fn json_dumps(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    let json = py.import("json")?;
    json.getattr("dumps")?.call1((value,))?.extract()
}

/// A key of the model's output as messages show it: JSON for a str, else its repr.
fn key_text(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<String> {
    if key.is_instance_of::<PyString>() {
        json_dumps(py, key)
    } else {
        Ok(key.repr()?.to_string())
    }
}

fn finish_tree(py: Python<'_>, raw: RawNode, path: &mut Vec<String>) -> PyResult<Node> {
    match raw {
        RawNode::Leaf(index) => Ok(Node::Leaf(index)),
        RawNode::Dict(entries) => {
            let names: Vec<String> = entries.iter().map(|(name, _)| name.clone()).collect();
            let keys_text = json_dumps(py, &names.clone().into_pyobject(py)?)?;
            let r#where = path_text(py, "action", path)?;
            // Interned once, so a call looks keys up without making a str per key.
            let mut keys = Vec::new();
            let mut children = Vec::new();
            for (name, child) in entries {
                keys.push(PyString::intern(py, &name).unbind());
                path.push(name);
                children.push(finish_tree(py, child, path)?);
                path.pop();
            }
            Ok(Node::Dict(DictNode {
                r#where,
                keys_text,
                names,
                keys,
                children,
            }))
        }
    }
}

/// `values` (any array-like) as a flat vector of `T`, refusing a size that is not the leaf's.
fn flat<T: Element + Copy>(
    leaf: &Leaf,
    values: &Bound<'_, PyAny>,
    name: &str,
    dtype_name: &str,
) -> PyResult<Vec<T>> {
    let numpy = values.py().import("numpy")?;
    let kwargs = PyDict::new(values.py());
    kwargs.set_item("dtype", dtype_name)?;
    let array = numpy
        .getattr("asarray")?
        .call((values,), Some(&kwargs))?
        .call_method1("reshape", (-1,))?;
    let flat: Vec<T> = array.cast_into::<numpy::PyArray1<T>>()?.to_vec()?;
    if flat.len() != leaf.size {
        return Err(PyValueError::new_err(format!(
            "{}: {name} has {} values for an action of shape {}",
            leaf.r#where,
            flat.len(),
            shape_text(&leaf.shape)
        )));
    }
    Ok(flat)
}

/// The leaf an `ActionLeafPlan` describes, read attribute by attribute.
fn read_leaf(plan: &Bound<'_, PyAny>) -> PyResult<Leaf> {
    let py = plan.py();
    let items: Vec<Bound<'_, PyAny>> =
        plan.getattr("path")?.try_iter()?.collect::<PyResult<_>>()?;
    if !items.iter().all(|key| key.is_instance_of::<PyString>()) {
        let path = PyTuple::new(py, &items)?;
        return Err(PyValueError::new_err(format!(
            "an action leaf's path must be a tuple of str, got {}",
            path.repr()?
        )));
    }
    let path: Vec<String> = items
        .iter()
        .map(|key| key.extract())
        .collect::<PyResult<_>>()?;
    let r#where = path_text(py, "action", &path)?;
    let kind_name = plan.getattr("kind")?.str()?;
    let Some(&(_, kind_label, kind)) = KIND_NAMES
        .iter()
        .find(|(name, _, _)| kind_name.to_str().is_ok_and(|text| text == *name))
    else {
        let names: Vec<&str> = KIND_NAMES.iter().map(|(name, _, _)| *name).collect();
        return Err(PyValueError::new_err(format!(
            "{where}: unknown action leaf kind {}; expected one of {}",
            kind_name.repr()?,
            names.join(", ")
        )));
    };
    let shape: Vec<usize> = plan
        .getattr("shape")?
        .try_iter()?
        .map(|size| size?.extract())
        .collect::<PyResult<_>>()?;
    let size = shape.iter().product();
    let numpy = py.import("numpy")?;
    let dtype = numpy
        .getattr("dtype")?
        .call1((plan.getattr("dtype")?.str()?,))?;
    let dtype_name: String = dtype.getattr("name")?.extract()?;
    let dtype_kind: String = dtype.getattr("kind")?.extract()?;
    let integer = INTEGRAL_KINDS.contains(&dtype_kind.as_bytes()[0]);
    let (dtype_min, dtype_max) = if dtype_kind == "b" {
        (0, 1)
    } else if integer {
        let info = numpy.getattr("iinfo")?.call1((&dtype,))?;
        (
            info.getattr("min")?.extract()?,
            info.getattr("max")?.extract()?,
        )
    } else {
        (0, 0)
    };
    let mut leaf = Leaf {
        label: format!("{kind_label} {dtype_name}{}", shape_text(&shape)),
        out_dtype: OutDtype::from_name(&dtype_name),
        path,
        r#where,
        kind,
        shape,
        size,
        dtype: dtype_name,
        integer,
        dtype_min,
        dtype_max,
        box_rule: None,
        start: 0,
        n: 0,
        lowest: Vec::new(),
        stop: Vec::new(),
        layout: None,
    };
    leaf.layout = Layout::from_plan(plan, &leaf)?;
    match kind {
        Kind::Box => {
            let low: Vec<f64> = flat(&leaf, &plan.getattr("low")?, "low", "float64")?;
            let high: Vec<f64> = flat(&leaf, &plan.getattr("high")?, "high", "float64")?;
            let span = low
                .iter()
                .zip(&high)
                .map(|(low, high)| high - low)
                .collect();
            let rescale = plan.getattr("rescale")?;
            leaf.box_rule = Some(BoxRule {
                low,
                high,
                span,
                rescale: if rescale.is_none() {
                    None
                } else {
                    Some(rescale.extract()?)
                },
                clip: plan.getattr("clip")?.is_truthy()?,
            });
        }
        Kind::Discrete => {
            leaf.start = plan.getattr("start")?.extract()?;
            leaf.n = plan.getattr("n")?.extract()?;
        }
        Kind::MultiDiscrete => {
            let lowest: Vec<i64> =
                flat(&leaf, &plan.getattr("nvec_start")?, "nvec_start", "int64")?;
            let nvec: Vec<i64> = flat(&leaf, &plan.getattr("nvec")?, "nvec", "int64")?;
            // int64 arithmetic, as numpy's (which wraps).
            leaf.stop = lowest
                .iter()
                .zip(&nvec)
                .map(|(l, n)| l.wrapping_add(*n))
                .collect();
            leaf.lowest = lowest;
        }
        Kind::MultiBinary => {}
    }
    Ok(leaf)
}

/// One env actuator of a role-based layout (see `rlmesh.adapters.ActionSegmentPlan`).
#[derive(Debug, Clone)]
pub struct Segment {
    start: usize,
    stop: usize,
    rotation: Option<(Encoding, Encoding)>,
    range: Option<(f32, f32, f32)>,
    /// (scale, invert, threshold): the model side's, then the env side's.
    corrections: [(Option<f32>, bool, Option<f32>); 2],
    binary: bool,
    thresholded: bool,
    clip: Option<(f32, f32)>,
    fill: Option<(usize, f32)>,
}

/// A role-based action layout: the model's vector of `model_dim` values mapped onto the env's.
#[derive(Debug, Clone)]
pub struct Layout {
    model_dim: usize,
    segments: Vec<Segment>,
    clip: Option<(f32, f32)>,
}

impl Layout {
    fn from_plan(plan: &Bound<'_, PyAny>, leaf: &Leaf) -> PyResult<Option<Layout>> {
        let segments = plan.getattr("segments")?;
        if segments.is_none() {
            return Ok(None);
        }
        if leaf.kind != Kind::Box {
            return Err(PyValueError::new_err(format!(
                "{}: a role-based action layout needs a Box leaf",
                leaf.r#where
            )));
        }
        let pair = |value: Bound<'_, PyAny>| -> PyResult<Option<(f64, f64)>> {
            if value.is_none() {
                Ok(None)
            } else {
                value.extract().map(Some)
            }
        };
        let number = |value: Bound<'_, PyAny>| -> PyResult<Option<f32>> {
            if value.is_none() {
                Ok(None)
            } else {
                Ok(Some(value.extract::<f64>()? as f32))
            }
        };
        let mut planned = Vec::new();
        let mut filled = 0;
        for segment in segments.try_iter()? {
            let segment = segment?;
            let width: usize = segment.getattr("width")?.extract()?;
            filled += width;
            let name = |attribute: &str| -> PyResult<Option<Encoding>> {
                let value = segment.getattr(attribute)?;
                if value.is_none() {
                    return Ok(None);
                }
                let name: String = value.extract()?;
                Encoding::from_name(&name).map(Some).ok_or_else(|| {
                    PyValueError::new_err(format!("unknown rotation encoding '{name}'"))
                })
            };
            let rotation = match (name("encoding_from")?, name("encoding_to")?) {
                (Some(from), Some(to)) if from != to => Some((from, to)),
                _ => None,
            };
            let range = match (
                pair(segment.getattr("range_from")?)?,
                pair(segment.getattr("range_to")?)?,
            ) {
                (Some((lo_from, hi_from)), Some((lo_to, hi_to))) => Some((
                    lo_from as f32,
                    lo_to as f32,
                    ((hi_to - lo_to) / (hi_from - lo_from)) as f32,
                )),
                _ => None,
            };
            let model_threshold = number(segment.getattr("model_threshold")?)?;
            let threshold = number(segment.getattr("threshold")?)?;
            planned.push(Segment {
                start: segment.getattr("start")?.extract()?,
                stop: segment.getattr("stop")?.extract()?,
                rotation,
                range,
                corrections: [
                    (
                        number(segment.getattr("model_scale")?)?,
                        segment.getattr("model_invert")?.is_truthy()?,
                        model_threshold,
                    ),
                    (
                        number(segment.getattr("scale")?)?,
                        segment.getattr("invert")?.is_truthy()?,
                        threshold,
                    ),
                ],
                binary: segment.getattr("binary")?.is_truthy()?,
                thresholded: threshold.is_some() || model_threshold.is_some(),
                clip: pair(segment.getattr("clip")?)?.map(|(lo, hi)| (lo as f32, hi as f32)),
                fill: number(segment.getattr("fill")?)?.map(|fill| (width, fill)),
            });
        }
        if filled != leaf.size {
            return Err(PyValueError::new_err(format!(
                "{}: the action layout fills {filled} values of an action of {}",
                leaf.r#where, leaf.size
            )));
        }
        Ok(Some(Layout {
            model_dim: plan.getattr("model_dim")?.extract()?,
            segments: planned,
            clip: pair(plan.getattr("layout_clip")?)?.map(|(lo, hi)| (lo as f32, hi as f32)),
        }))
    }

    /// The model's rows (`[K, model_dim]` float64) mapped onto the env's (`[K, size]`), in
    /// float32 as the Python core does it, returned as float64.
    fn map(&self, values: &[f64], size: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(values.len() / self.model_dim.max(1) * size);
        for row in values.chunks_exact(self.model_dim.max(1)) {
            let row: Vec<f32> = row.iter().map(|&x| x as f32).collect();
            let mut mapped: Vec<f32> = Vec::with_capacity(size);
            for segment in &self.segments {
                if let Some((width, fill)) = segment.fill {
                    mapped.extend(std::iter::repeat_n(fill, width));
                    continue;
                }
                let mut piece: Vec<f32> = row[segment.start..segment.stop].to_vec();
                if let Some((from, to)) = segment.rotation {
                    let wide: Vec<f64> = piece.iter().map(|&x| f64::from(x)).collect();
                    piece = crate::rotations::convert(&wide, from, to)
                        .into_iter()
                        .map(|x| x as f32)
                        .collect();
                }
                if let Some((lo_from, lo_to, gain)) = segment.range {
                    piece
                        .iter_mut()
                        .for_each(|x| *x = lo_to + (*x - lo_from) * gain);
                }
                for (scale, invert, threshold) in segment.corrections {
                    if let Some(scale) = scale {
                        piece.iter_mut().for_each(|x| *x *= scale);
                    }
                    if invert {
                        piece.iter_mut().for_each(|x| *x = -*x);
                    }
                    if let Some(threshold) = threshold {
                        piece.iter_mut().for_each(|x| *x -= threshold);
                    }
                }
                if segment.binary {
                    for x in &mut piece {
                        // >= 0 opens; a raw 0 with no threshold declared stays neutral.
                        if segment.thresholded || *x != 0.0 {
                            *x = if *x >= 0.0 { 1.0 } else { -1.0 };
                        }
                    }
                }
                if let Some((low, high)) = segment.clip {
                    piece.iter_mut().for_each(|x| *x = clip_f32(*x, low, high));
                }
                mapped.extend(piece);
            }
            if let Some((low, high)) = self.clip {
                mapped.iter_mut().for_each(|x| *x = clip_f32(*x, low, high));
            }
            out.extend(mapped.iter().map(|&x| f64::from(x)));
        }
        out
    }
}

/// numpy's `clip` on float32: NaN passes through.
fn clip_f32(x: f32, low: f32, high: f32) -> f32 {
    if x < low {
        low
    } else if x > high {
        high
    } else {
        x
    }
}

/// Checks the model's batched action and converts it into the action space.
///
/// See ``rlmesh._pycore.actions.ActionApplier`` for the full contract and a runnable example;
/// both cores behave alike.
///
/// Args:
///     action_leaves: ``Plan.action``, one ``ActionLeafPlan`` per leaf of the action space.
///
/// Example:
///     >>> plan = ModelSpec(output=Action(rescale=(-1, 1))).compile(obs_space, action_space)
///     >>> applier = ActionApplier(plan.action)
///     >>> action = applier.apply_actions(model_output, lanes=[3, 5])  # [2, *shape] per leaf
#[pyclass(module = "rlmesh._core", frozen)]
pub struct ActionApplier {
    leaves: Vec<Leaf>,
    tree: Node,
    // numpy's conversions, looked up once rather than on every call.
    asarray: Py<PyAny>,
    ascontiguousarray: Py<PyAny>,
    /// The int64 scalar of each value of a small Discrete space, made on first use: a numpy
    /// scalar is immutable, so every step may hand an env the same one.
    scalars: PyOnceLock<Vec<Py<PyAny>>>,
}

/// The most values a Discrete space may have for `discrete_scalars` to keep their scalars.
const CACHED_SCALARS: i64 = 1024;

/// `value` as a new numpy int64 scalar.
fn int64_scalar(py: Python<'_>, value: i64) -> PyResult<Bound<'_, PyAny>> {
    let mut value = value;
    let int64 = dtype::<i64>(py);
    // SAFETY: numpy copies the 8 bytes of `value` into a new int64 scalar (no base object),
    // reading the descriptor without taking its reference.
    unsafe {
        let scalar = PY_ARRAY_API.PyArray_Scalar(
            py,
            (&mut value as *mut i64).cast(),
            int64.as_dtype_ptr(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, scalar)
    }
}

impl ActionApplier {
    /// `apply_actions` with the lanes already read: one array per leaf, nested like the space.
    /// Messages name row `k`'s lane as `lane_text(k)` (the round runner adds the episode and
    /// step).
    pub(crate) fn apply<'py>(
        &self,
        py: Python<'py>,
        batched_model_output: &Bound<'py, PyAny>,
        lanes: &[i64],
        lane_text: LaneText<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.apply_node(py, &self.tree, batched_model_output, lanes, lane_text)
    }

    /// The env actions of a per-lane corner's plain integer outputs, one per lane, as numpy
    /// int64 scalars: what indexing `apply`'s `[K]` output gives a lane, without the arrays on
    /// the way. Only for an action space that is one `Discrete` leaf of int64 whose values
    /// float64 holds exactly (so `apply` would compare and cast each value exactly), and only
    /// when every value is in range; None otherwise, and `apply` decides (and words any
    /// refusal).
    pub(crate) fn discrete_scalars<'py>(
        &self,
        py: Python<'py>,
        values: &[i64],
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        let (Node::Leaf(_), [leaf]) = (&self.tree, self.leaves.as_slice()) else {
            return Ok(None);
        };
        let stop = i128::from(leaf.start) + i128::from(leaf.n);
        let exact = |bound: i128| bound.abs() <= 1 << f64::MANTISSA_DIGITS;
        let fits = leaf.kind == Kind::Discrete
            && leaf.out_dtype == OutDtype::I64
            && leaf.shape.is_empty()
            && exact(i128::from(leaf.start))
            && exact(stop);
        if !fits
            || values
                .iter()
                .any(|&value| value < leaf.start || i128::from(value) >= stop)
        {
            return Ok(None);
        }
        if leaf.n <= CACHED_SCALARS {
            let scalars = self.scalars.get_or_try_init(py, || {
                (leaf.start..stop as i64)
                    .map(|value| int64_scalar(py, value).map(Bound::unbind))
                    .collect::<PyResult<Vec<_>>>()
            })?;
            let scalar = |value: i64| scalars[(value - leaf.start) as usize].bind(py).clone();
            return Ok(Some(values.iter().map(|&value| scalar(value)).collect()));
        }
        values
            .iter()
            .map(|&value| int64_scalar(py, value))
            .collect::<PyResult<_>>()
            .map(Some)
    }

    fn apply_node<'py>(
        &self,
        py: Python<'py>,
        node: &Node,
        output: &Bound<'py, PyAny>,
        lanes: &[i64],
        lane_text: LaneText<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dict = match node {
            Node::Leaf(index) => {
                let leaf = &self.leaves[*index];
                return self.apply_leaf(py, leaf, output, lanes.len(), lane_text);
            }
            Node::Dict(dict) => dict,
        };
        let Ok(mapping) = output.cast::<PyMapping>() else {
            return Err(OutputError(format!(
                "{}: expected a dict with keys {}, got {}",
                dict.r#where,
                dict.keys_text,
                type_name(output)?
            ))
            .into());
        };
        for key in &dict.keys {
            let key = key.bind(py);
            if !mapping.contains(key)? {
                return Err(OutputError(format!(
                    "{}: missing key {}; expected keys {}",
                    dict.r#where,
                    key_text(py, key)?,
                    dict.keys_text
                ))
                .into());
            }
        }
        for key in output.try_iter()? {
            let key = key?;
            let known = key.cast::<PyString>().is_ok_and(|name| {
                name.to_str()
                    .is_ok_and(|name| dict.names.iter().any(|known| known == name))
            });
            if !known {
                return Err(OutputError(format!(
                    "{}: unexpected key {}; expected keys {}",
                    dict.r#where,
                    key_text(py, &key)?,
                    dict.keys_text
                ))
                .into());
            }
        }
        let result = PyDict::new(py);
        for (key, child) in dict.keys.iter().zip(&dict.children) {
            let key = key.bind(py);
            let value = mapping.get_item(key)?;
            result.set_item(key, self.apply_node(py, child, &value, lanes, lane_text)?)?;
        }
        Ok(result.into_any())
    }

    fn apply_leaf<'py>(
        &self,
        py: Python<'py>,
        leaf: &Leaf,
        output: &Bound<'py, PyAny>,
        count: usize,
        lane_text: LaneText<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // An ndarray is read as it is: what numpy.asarray would return has its dtype and shape.
        let array = match output.cast::<PyUntypedArray>() {
            Ok(array) => array.clone(),
            Err(_) => match self.asarray.bind(py).call1((output,)) {
                Ok(array) => array.cast_into::<PyUntypedArray>()?,
                Err(err)
                    if err.is_instance_of::<PyTypeError>(py)
                        || err.is_instance_of::<PyValueError>(py) =>
                {
                    return Err(OutputError(format!(
                        "{}: expected {} (one per lane) of {}, got {} that numpy cannot \
                             read as an array: {}",
                        leaf.r#where,
                        count_text(count, "row"),
                        leaf.label,
                        type_name(output)?,
                        err.value(py).str()?
                    ))
                    .into());
                }
                Err(err) => return Err(err),
            },
        };
        let input_dtype = array.dtype();
        let input_kind = input_dtype.kind();
        if !NUMERIC_KINDS.contains(&input_kind) {
            return Err(OutputError(format!(
                "{}: expected numbers for {}, got dtype {}",
                leaf.r#where,
                leaf.label,
                input_dtype.str()?
            ))
            .into());
        }
        let shape = array.shape();
        if shape.is_empty() || shape[0] != count {
            return Err(OutputError(format!(
                "{}: expected {} (one per lane) of {}, got shape {}",
                leaf.r#where,
                count_text(count, "row"),
                leaf.label,
                shape_text(shape)
            ))
            .into());
        }
        let layout_shape = leaf.layout.as_ref().map(|layout| vec![layout.model_dim]);
        let row_shape = layout_shape.as_deref().unwrap_or(&leaf.shape);
        if count > 0 && !row_shape_fits(&shape[1..], row_shape) {
            let expected = if row_shape.iter().product::<usize>() == 1 && row_shape.len() <= 1 {
                "[] or [1]".to_string()
            } else {
                shape_text(row_shape)
            };
            return Err(OutputError(format!(
                "{}: {}: expected shape {expected} per lane for {}, got {}",
                lane_text(0),
                leaf.r#where,
                leaf.label,
                shape_text(&shape[1..])
            ))
            .into());
        }
        let integral_input = INTEGRAL_KINDS.contains(&input_kind);
        // Read as contiguous float64: borrowed when it already is; float32 and int64 (what most
        // models return) widened here, exactly as numpy would; anything else by one numpy
        // conversion.
        let float64 = dtype::<f64>(py);
        let contiguous = array.is_c_contiguous();
        let widened: Vec<f64>;
        let converted: Bound<'py, PyArrayDyn<f64>>;
        let borrowed;
        let values: &[f64] = if contiguous && input_dtype.is_equiv_to(&float64) {
            borrowed = array.cast::<PyArrayDyn<f64>>()?.readonly();
            borrowed.as_slice()?
        } else if contiguous && input_dtype.is_equiv_to(&dtype::<f32>(py)) {
            let narrow = array.cast::<PyArrayDyn<f32>>()?;
            // SAFETY: a contiguous array read once, copied out before any Python code runs.
            let narrow = unsafe { narrow.as_slice()? };
            widened = narrow.iter().map(|&x| f64::from(x)).collect();
            &widened
        } else if contiguous && input_dtype.is_equiv_to(&dtype::<i64>(py)) {
            // What a discrete policy returns: rounded to nearest like numpy's cast.
            let integers = array.cast::<PyArrayDyn<i64>>()?;
            // SAFETY: as above.
            let integers = unsafe { integers.as_slice()? };
            widened = integers.iter().map(|&x| x as f64).collect();
            &widened
        } else {
            converted = self
                .ascontiguousarray
                .bind(py)
                .call1((&array, float64))?
                .cast_into::<PyArrayDyn<f64>>()?;
            borrowed = converted.readonly();
            borrowed.as_slice()?
        };
        let mapped;
        let values: &[f64] = match &leaf.layout {
            Some(layout) => {
                mapped = layout.map(values, leaf.size);
                &mapped
            }
            None => values,
        };
        let mut dims = Vec::with_capacity(1 + leaf.shape.len());
        dims.push(count);
        dims.extend_from_slice(&leaf.shape);
        let converted = match leaf.out_dtype {
            OutDtype::F64 => write::<f64>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::F32 => write::<f32>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::I64 => write::<i64>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::I32 => write::<i32>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::I16 => write::<i16>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::I8 => write::<i8>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::U64 => write::<u64>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::U32 => write::<u32>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::U16 => write::<u16>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::U8 => write::<u8>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::Bool => write::<bool>(py, leaf, values, lane_text, integral_input, &dims)?,
            OutDtype::Other => {
                // A dtype Rust has no type for (float16, ...): numpy casts the float64 action.
                let converted = write::<f64>(py, leaf, values, lane_text, integral_input, &dims)?;
                // Past the dtype's range becomes inf without a warning, as in the Python core
                // (which casts under np.errstate(all="ignore")).
                let kwargs = PyDict::new(py);
                kwargs.set_item("all", "ignore")?;
                let quiet = py
                    .import("numpy")?
                    .getattr("errstate")?
                    .call((), Some(&kwargs))?;
                quiet.call_method0("__enter__")?;
                let cast = converted.call_method1("astype", (leaf.dtype.as_str(),));
                quiet.call_method1("__exit__", (py.None(), py.None(), py.None()))?;
                cast?
            }
        };
        Ok(converted)
    }
}

/// The action of one leaf as a new numpy array of `T`, shape `dims` (`[K, *shape]`).
fn write<'py, T: FromF64>(
    py: Python<'py>,
    leaf: &Leaf,
    values: &[f64],
    lane_text: LaneText<'_>,
    integral_input: bool,
    dims: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let converted = PyArrayDyn::<T>::zeros(py, IxDyn(dims), false);
    // SAFETY: a new C-contiguous array nobody else has seen, written by Rust code alone.
    let out = unsafe { converted.as_slice_mut()? };
    leaf.convert(values, lane_text, integral_input, out)?;
    Ok(converted.into_any())
}

#[pymethods]
impl ActionApplier {
    #[new]
    pub(crate) fn py_new(py: Python<'_>, action_leaves: &Bound<'_, PyAny>) -> PyResult<Self> {
        let leaves: Vec<Leaf> = action_leaves
            .try_iter()?
            .map(|plan| read_leaf(&plan?))
            .collect::<PyResult<_>>()?;
        let raw = build_tree(&leaves)?;
        let tree = finish_tree(py, raw, &mut Vec::new())?;
        let numpy = py.import("numpy")?;
        Ok(ActionApplier {
            leaves,
            tree,
            asarray: numpy.getattr("asarray")?.unbind(),
            ascontiguousarray: numpy.getattr("ascontiguousarray")?.unbind(),
            scalars: PyOnceLock::new(),
        })
    }

    /// The model's action for ``K`` lanes, checked and converted into the action space.
    ///
    /// ``batched_model_output``: an array-like ``[K, *shape]`` (``[K]`` or ``[K, 1]`` for a
    /// leaf of one value), or for a Dict action space a dict with the space's keys (nested like
    /// the space), each leaf such an array-like.
    /// ``lanes``: ``[K]`` int, the lanes the rows belong to. Returns one array ``[K, *shape]``
    /// of the space's dtype per leaf, nested in dicts like a Dict action space.
    fn apply_actions<'py>(
        &self,
        py: Python<'py>,
        batched_model_output: &Bound<'py, PyAny>,
        lanes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lanes = vector::<i64>(lanes, Dtype::Int64, "lanes")?;
        let lanes = lanes.as_slice()?;
        self.apply(py, batched_model_output, lanes, &|row| {
            format!("lane {}", lanes[row])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_leaf(kind: Kind, shape: &[usize], dtype: &str) -> Leaf {
        let size = shape.iter().product();
        let (integer, dtype_min, dtype_max) = match dtype {
            "uint8" => (true, 0, 255),
            "int64" => (true, i64::MIN as i128, i64::MAX as i128),
            "int8" => (true, -128, 127),
            _ => (false, 0, 0),
        };
        let name = KIND_NAMES.iter().find(|entry| entry.2 == kind).unwrap().1;
        Leaf {
            path: vec!["arm".to_string()],
            r#where: "action[\"arm\"]".to_string(),
            kind,
            shape: shape.to_vec(),
            size,
            dtype: dtype.to_string(),
            out_dtype: OutDtype::from_name(dtype),
            label: format!("{name} {dtype}{}", shape_text(shape)),
            integer,
            dtype_min,
            dtype_max,
            box_rule: None,
            start: 0,
            n: 0,
            lowest: Vec::new(),
            stop: Vec::new(),
            layout: None,
        }
    }

    fn boxed(shape: &[usize], dtype: &str, rescale: Option<(f64, f64)>, clip: bool) -> Leaf {
        let size: usize = shape.iter().product();
        let mut leaf = plain_leaf(Kind::Box, shape, dtype);
        let (low, high) = if leaf.integer {
            (0.0, 255.0)
        } else {
            (-2.0, 2.0)
        };
        leaf.box_rule = Some(BoxRule {
            low: vec![low; size],
            high: vec![high; size],
            span: vec![high - low; size],
            rescale,
            clip,
        });
        leaf
    }

    fn convert<T: FromF64 + Default>(
        leaf: &Leaf,
        values: &[f64],
        lanes: &[i64],
        integral_input: bool,
    ) -> Result<Vec<T>, String> {
        let mut out = vec![T::default(); values.len()];
        let lane_text = |row: usize| format!("lane {}", lanes[row]);
        leaf.convert(values, &lane_text, integral_input, &mut out)
            .map(|()| out)
            .map_err(|err| err.0)
    }

    #[test]
    fn float_repr_matches_python() {
        // Pinned against CPython's repr(float).
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (2.0, "2.0"),
            (2.5, "2.5"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234566e17, "1.2345678901234566e+17"),
            (123456.789, "123456.789"),
            (1e300, "1e+300"),
            (5e-324, "5e-324"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (value, text) in cases {
            assert_eq!(float_repr(value), text, "{value:e}");
        }
    }

    #[test]
    fn a_row_fits_only_the_actions_shape_or_a_single_values_other_form() {
        assert!(row_shape_fits(&[2, 3], &[2, 3]));
        for (row, shape) in [(&[6][..], &[2, 3][..]), (&[3, 2], &[6]), (&[1, 6], &[6])] {
            assert!(!row_shape_fits(row, shape), "{row:?} for {shape:?}");
        }
        // One value: a scalar and a one-element vector are the same action.
        assert!(row_shape_fits(&[], &[1]) && row_shape_fits(&[1], &[]));
        assert!(!row_shape_fits(&[1, 1], &[1]) && !row_shape_fits(&[], &[1, 1]));
        assert!(!row_shape_fits(&[2], &[]));
    }

    #[test]
    fn elements_are_named_row_major() {
        assert_eq!(index_text(5, &[2, 3]), "[1, 2]");
        assert_eq!(index_text(3, &[7]), "[3]");
        assert_eq!(index_text(0, &[]), "");
    }

    #[test]
    fn a_box_rescales_then_clips_then_casts() {
        let leaf = boxed(&[2], "float32", Some((-1.0, 1.0)), true);
        let out: Vec<f32> = convert(&leaf, &[0.5, -1.0, 3.0, 0.0], &[4, 9], false).unwrap();
        assert_eq!(out, vec![1.0, -2.0, 2.0, 0.0]);
        let unclipped = boxed(&[2], "float32", None, false);
        let out: Vec<f32> = convert(&unclipped, &[5.0, -7.5], &[0], false).unwrap();
        assert_eq!(out, vec![5.0, -7.5]);
    }

    #[test]
    fn a_non_finite_box_value_names_lane_and_element() {
        let leaf = boxed(&[2], "float32", None, true);
        let err = convert::<f32>(&leaf, &[0.0, 0.0, 0.0, f64::NAN], &[4, 9], false).unwrap_err();
        assert_eq!(
            err,
            "lane 9: action[\"arm\"][1] is nan; expected a finite number for Box float32[2]"
        );
    }

    #[test]
    fn an_integer_box_rounds_after_rescale_and_refuses_what_its_dtype_cannot_hold() {
        let leaf = boxed(&[1], "uint8", Some((-1.0, 1.0)), false);
        let out: Vec<u8> = convert(&leaf, &[0.0, 1.0], &[0, 1], false).unwrap();
        assert_eq!(out, vec![128, 255]); // 127.5 rounds half to even
        let err = convert::<u8>(&leaf, &[1.5], &[3], false).unwrap_err();
        assert_eq!(
            err,
            "lane 3: action[\"arm\"][0] is 1.5 (319.0 after rescale); expected an integer \
             uint8 holds (0..255) for Box uint8[1]"
        );
        let plain = boxed(&[1], "uint8", None, true);
        let err = convert::<u8>(&plain, &[2.5], &[3], false).unwrap_err();
        assert!(
            err.ends_with("is 2.5; expected an integer for Box uint8[1]"),
            "{err}"
        );
    }

    #[test]
    fn discrete_values_are_integers_in_start_to_start_plus_n() {
        let mut leaf = plain_leaf(Kind::Discrete, &[], "int64");
        (leaf.start, leaf.n) = (-1, 3);
        let out: Vec<i64> = convert(&leaf, &[-1.0, 1.0], &[0, 1], false).unwrap();
        assert_eq!(out, vec![-1, 1]);
        for (value, integral, shown) in [
            (2.0, true, "2"),
            (0.5, false, "0.5"),
            (f64::NAN, false, "nan"),
        ] {
            let err = convert::<i64>(&leaf, &[0.0, value], &[0, 6], integral).unwrap_err();
            assert_eq!(
                err,
                format!(
                    "lane 6: action[\"arm\"] is {shown}; expected an integer in -1..1 for \
                     Discrete int64[]"
                )
            );
        }
    }

    #[test]
    fn multi_discrete_and_multi_binary_check_each_element() {
        let mut leaf = plain_leaf(Kind::MultiDiscrete, &[2], "int64");
        (leaf.lowest, leaf.stop) = (vec![0, 5], vec![3, 7]);
        let err = convert::<i64>(&leaf, &[2.0, 5.0, 1.0, 7.0], &[0, 2], true).unwrap_err();
        assert_eq!(
            err,
            "lane 2: action[\"arm\"][1] is 7; expected an integer in 5..6 for MultiDiscrete \
             int64[2]"
        );
        let binary = plain_leaf(Kind::MultiBinary, &[3], "int8");
        let out: Vec<i8> = convert(&binary, &[1.0, 0.0, 1.0], &[0], false).unwrap();
        assert_eq!(out, vec![1, 0, 1]);
        let err = convert::<i8>(&binary, &[1.0, -1.0, 2.0], &[5], false).unwrap_err();
        assert!(err.starts_with("lane 5: action[\"arm\"][1] is -1.0; expected 0 or 1"));
    }
}
