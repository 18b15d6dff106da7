//! Image resizing: `bilinear` (OpenCV's `INTER_LINEAR`) and `bilinear_aa` (Pillow's).
//!
//! Mirrors `python/rlmesh/_pycore/resize.py` name for name (that file states the rules), with
//! the same taps and the same order of operations, so both cores give the same bits. Images
//! are `[H, W, C]`, C-contiguous, uint8 (`resize_u8`) or float64 (`resize_f64`). The taps are
//! planned once per leaf (`Resizer::plan`), then every lane's frame reuses them.

const PRECISION_BITS: u32 = 32 - 8 - 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    Bilinear,
    BilinearAa,
}

impl Resample {
    pub fn from_name(name: &str) -> Option<Resample> {
        match name {
            "bilinear" => Some(Resample::Bilinear),
            "bilinear_aa" => Some(Resample::BilinearAa),
            _ => None,
        }
    }
}

/// Per output index: the two source indices and the weight of the second.
#[derive(Debug, Clone)]
struct LinearTaps {
    low: Vec<usize>,
    high: Vec<usize>,
    frac: Vec<f64>,
}

fn bilinear_taps(size_in: usize, size_out: usize) -> LinearTaps {
    let scale = size_in as f64 / size_out as f64;
    let mut taps = LinearTaps {
        low: Vec::with_capacity(size_out),
        high: Vec::with_capacity(size_out),
        frac: Vec::with_capacity(size_out),
    };
    for index in 0..size_out {
        let source = ((index as f64 + 0.5) * scale - 0.5).max(0.0);
        let low = (source.floor() as usize).min(size_in - 1);
        taps.low.push(low);
        taps.high.push((low + 1).min(size_in - 1));
        taps.frac.push(if low < size_in - 1 {
            source - low as f64
        } else {
            0.0
        });
    }
    taps
}

/// Per output index: the first source index, the normalized weights, and Pillow's fixed
/// point weights.
#[derive(Debug, Clone)]
pub struct AaTaps {
    first: Vec<usize>,
    weights: Vec<Vec<f64>>,
    fixed: Vec<Vec<i64>>,
    /// `fixed` packed for the uint8 passes: output `i`'s weights at `i * span ..`, as i32
    /// (a uint8 sum of them stays below 2**31, so i32 sums equal the i64 ones).
    span: usize,
    packed: Vec<i32>,
}

fn aa_taps(size_in: usize, size_out: usize) -> AaTaps {
    let scale = size_in as f64 / size_out as f64;
    let filter_scale = scale.max(1.0);
    let support = filter_scale;
    let mut taps = AaTaps {
        first: Vec::with_capacity(size_out),
        weights: Vec::with_capacity(size_out),
        fixed: Vec::with_capacity(size_out),
        span: 0,
        packed: Vec::new(),
    };
    for index in 0..size_out {
        let center = (index as f64 + 0.5) * scale;
        // Python's int(): toward zero; then clamped, as Pillow does.
        let low = ((center - support + 0.5).trunc() as i64).max(0) as usize;
        let high = ((center + support + 0.5).trunc() as i64).min(size_in as i64) as usize;
        let raw: Vec<f64> = (low..high)
            .map(|source| (1.0 - ((source as f64 - center + 0.5) / filter_scale).abs()).max(0.0))
            .collect();
        let total: f64 = raw.iter().fold(0.0, |sum, weight| sum + weight);
        let weights: Vec<f64> = if total != 0.0 {
            raw.iter().map(|weight| weight / total).collect()
        } else {
            raw
        };
        let scale_fixed = (1u64 << PRECISION_BITS) as f64;
        taps.fixed.push(
            weights
                .iter()
                .map(|weight| (weight * scale_fixed + 0.5).floor() as i64)
                .collect(),
        );
        taps.first.push(low);
        taps.weights.push(weights);
    }
    taps.span = taps.fixed.iter().map(Vec::len).max().unwrap_or(0);
    taps.packed = vec![0; size_out * taps.span];
    for (index, kernel) in taps.fixed.iter().enumerate() {
        for (tap, &weight) in kernel.iter().enumerate() {
            taps.packed[index * taps.span + tap] = weight as i32;
        }
    }
    taps
}

/// A resize from one image size to another, its taps planned once.
#[derive(Debug, Clone)]
pub struct Resizer {
    resample: Resample,
    height_in: usize,
    width_in: usize,
    height: usize,
    width: usize,
    channels: usize,
    rows: LinearTaps,
    columns: LinearTaps,
    aa_rows: AaTaps,
    aa_columns: AaTaps,
}

impl Resizer {
    pub fn plan(
        resample: Resample,
        (height_in, width_in, channels): (usize, usize, usize),
        (height, width): (usize, usize),
    ) -> Resizer {
        Resizer {
            resample,
            height_in,
            width_in,
            height,
            width,
            channels,
            rows: bilinear_taps(height_in, height),
            columns: bilinear_taps(width_in, width),
            aa_rows: aa_taps(height_in, height),
            aa_columns: aa_taps(width_in, width),
        }
    }

    /// The number of values of the resized image.
    pub fn out_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// `image` (`[H, W, C]` uint8) resized into `out` (`[height, width, C]`).
    pub fn resize_u8(&self, image: &[u8], out: &mut [u8]) {
        match self.resample {
            Resample::Bilinear => {
                let mut values = vec![0.0; self.out_len()];
                self.bilinear(|index| f64::from(image[index]), &mut values);
                for (out, value) in out.iter_mut().zip(values) {
                    *out = value.round_ties_even().clamp(0.0, 255.0) as u8;
                }
            }
            Resample::BilinearAa => {
                // Horizontal, then vertical, each rounded and clipped to uint8 (Pillow).
                let horizontal = self.aa_horizontal_u8(image);
                self.aa_vertical_u8(&horizontal, out);
            }
        }
    }

    /// `image` (`[H, W, C]` float64) resized into `out` (`[height, width, C]` float64).
    pub fn resize_f64(&self, image: &[f64], out: &mut [f64]) {
        match self.resample {
            Resample::Bilinear => self.bilinear(|index| image[index], out),
            Resample::BilinearAa => {
                let horizontal = self.aa_horizontal(image, |total: f64| total);
                self.aa_vertical(&horizontal, out, |total: f64| total);
            }
        }
    }

    /// Rows first, then columns, in float64: as numpy evaluates the Python core's arrays.
    fn bilinear(&self, pixel: impl Fn(usize) -> f64, out: &mut [f64]) {
        let (c, w_in) = (self.channels, self.width_in);
        for (y, out_row) in out.chunks_exact_mut(self.width * c).enumerate() {
            let (y0, y1, fy) = (self.rows.low[y], self.rows.high[y], self.rows.frac[y]);
            for x in 0..self.width {
                let (x0, x1, fx) = (
                    self.columns.low[x],
                    self.columns.high[x],
                    self.columns.frac[x],
                );
                for channel in 0..c {
                    let at = |row: usize, column: usize| pixel((row * w_in + column) * c + channel);
                    let left = at(y0, x0) * (1.0 - fy) + at(y1, x0) * fy;
                    let right = at(y0, x1) * (1.0 - fy) + at(y1, x1) * fy;
                    out_row[x * c + channel] = left * (1.0 - fx) + right * fx;
                }
            }
        }
    }
}

fn clip8(total: i32) -> u8 {
    (total >> PRECISION_BITS).clamp(0, 255) as u8
}

impl Resizer {
    /// The horizontal uint8 pass: per pixel, each channel summed over the taps.
    fn aa_horizontal_u8(&self, image: &[u8]) -> Vec<u8> {
        let (c, w_in, w) = (self.channels, self.width_in, self.width);
        if w == w_in {
            return image.to_vec();
        }
        let taps = &self.aa_columns;
        let start: i32 = 1 << (PRECISION_BITS - 1);
        let mut out = vec![0u8; self.height_in * w * c];
        for (row, out_row) in image
            .chunks_exact(w_in * c)
            .zip(out.chunks_exact_mut(w * c))
        {
            for (x, pixel) in out_row.chunks_exact_mut(c).enumerate() {
                let count = taps.fixed[x].len();
                let kernel = &taps.packed[x * taps.span..x * taps.span + count];
                let window = &row[taps.first[x] * c..(taps.first[x] + count) * c];
                if c == 3 {
                    let mut sums = [start; 3];
                    for (&weight, source) in kernel.iter().zip(window.chunks_exact(3)) {
                        sums[0] += weight * i32::from(source[0]);
                        sums[1] += weight * i32::from(source[1]);
                        sums[2] += weight * i32::from(source[2]);
                    }
                    pixel[0] = clip8(sums[0]);
                    pixel[1] = clip8(sums[1]);
                    pixel[2] = clip8(sums[2]);
                } else {
                    for (channel, target) in pixel.iter_mut().enumerate() {
                        let mut sum = start;
                        for (&weight, source) in kernel.iter().zip(window.chunks_exact(c)) {
                            sum += weight * i32::from(source[channel]);
                        }
                        *target = clip8(sum);
                    }
                }
            }
        }
        out
    }

    /// The vertical uint8 pass, a whole row at a time (the sums in tap order).
    fn aa_vertical_u8(&self, image: &[u8], out: &mut [u8]) {
        let line = self.width * self.channels;
        if self.height == self.height_in {
            out.copy_from_slice(image);
            return;
        }
        let taps = &self.aa_rows;
        let start: i32 = 1 << (PRECISION_BITS - 1);
        let mut totals = vec![start; line];
        for (y, out_row) in out.chunks_exact_mut(line).enumerate() {
            totals.fill(start);
            let count = taps.fixed[y].len();
            for (tap, &weight) in taps.packed[y * taps.span..y * taps.span + count]
                .iter()
                .enumerate()
            {
                let row = &image[(taps.first[y] + tap) * line..][..line];
                for (total, &value) in totals.iter_mut().zip(row) {
                    *total += weight * i32::from(value);
                }
            }
            for (out, &total) in out_row.iter_mut().zip(&totals) {
                *out = clip8(total);
            }
        }
    }
}

/// A value the generic `bilinear_aa` passes sum (float64; uint8 has its own fixed-point passes).
pub trait AaValue: Copy + Default {
    type Sum: Copy + std::ops::Add<Output = Self::Sum>;
    fn start() -> Self::Sum;
    /// The weight of tap `tap` of output `index`: fixed point for uint8.
    fn weight(taps: &AaTaps, index: usize, tap: usize) -> Self::Sum;
    fn term(weight: Self::Sum, value: Self) -> Self::Sum;
}

impl AaValue for f64 {
    type Sum = f64;
    fn start() -> f64 {
        0.0
    }
    fn weight(taps: &AaTaps, index: usize, tap: usize) -> f64 {
        taps.weights[index][tap]
    }
    fn term(weight: f64, value: f64) -> f64 {
        weight * value
    }
}

impl Resizer {
    /// The horizontal pass of `bilinear_aa` (the image itself when the width stays).
    fn aa_horizontal<T: AaValue>(&self, image: &[T], finish: impl Fn(T::Sum) -> T) -> Vec<T> {
        let (c, w_in, w) = (self.channels, self.width_in, self.width);
        if w == w_in {
            return image.to_vec();
        }
        let taps = &self.aa_columns;
        let mut out = vec![T::default(); self.height_in * w * c];
        for (row, out_row) in image
            .chunks_exact(w_in * c)
            .zip(out.chunks_exact_mut(w * c))
        {
            for (x, (first, weights)) in taps.first.iter().zip(&taps.weights).enumerate() {
                for channel in 0..c {
                    let mut total = T::start();
                    for tap in 0..weights.len() {
                        let value = row[(first + tap) * c + channel];
                        total = total + T::term(T::weight(taps, x, tap), value);
                    }
                    out_row[x * c + channel] = finish(total);
                }
            }
        }
        out
    }

    /// The vertical pass of `bilinear_aa`, a whole row at a time (the sums in tap order).
    fn aa_vertical<T: AaValue>(&self, image: &[T], out: &mut [T], finish: impl Fn(T::Sum) -> T) {
        let line = self.width * self.channels;
        if self.height == self.height_in {
            out.copy_from_slice(image);
            return;
        }
        let taps = &self.aa_rows;
        let mut totals = vec![T::start(); line];
        for (y, out_row) in out.chunks_exact_mut(line).enumerate() {
            totals.fill(T::start());
            for tap in 0..taps.weights[y].len() {
                let row = &image[(taps.first[y] + tap) * line..][..line];
                let weight = T::weight(taps, y, tap);
                for (total, &value) in totals.iter_mut().zip(row) {
                    *total = *total + T::term(weight, value);
                }
            }
            for (out, &total) in out_row.iter_mut().zip(&totals) {
                *out = finish(total);
            }
        }
    }
}
