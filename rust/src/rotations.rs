//! Rotation encodings, converted through the 3x3 rotation matrix.
//!
//! Mirrors `python/rlmesh/_pycore/rotations.py` name for name, in float64 and in the same
//! order of operations, so both cores give the same bits.

const EPS: f64 = 1e-12;

/// A rotation encoding and its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    QuatXyzw,
    QuatWxyz,
    AxisAngle,
    EulerXyz,
    Rot6d,
    Rot6dRowMajor,
    Matrix,
}

impl Encoding {
    pub fn from_name(name: &str) -> Option<Encoding> {
        Some(match name {
            "quat_xyzw" => Encoding::QuatXyzw,
            "quat_wxyz" => Encoding::QuatWxyz,
            "axis_angle" => Encoding::AxisAngle,
            "euler_xyz" => Encoding::EulerXyz,
            "rot6d" => Encoding::Rot6d,
            "rot6d_rowmajor" => Encoding::Rot6dRowMajor,
            "matrix" => Encoding::Matrix,
            _ => return None,
        })
    }

    pub fn width(self) -> usize {
        match self {
            Encoding::QuatXyzw | Encoding::QuatWxyz => 4,
            Encoding::AxisAngle | Encoding::EulerXyz => 3,
            Encoding::Rot6d | Encoding::Rot6dRowMajor => 6,
            Encoding::Matrix => 9,
        }
    }
}

type Matrix = [[f64; 3]; 3];

const EYE: Matrix = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

/// One rotation `values` (`source.width()` long) re-encoded as `target`.
pub fn convert(values: &[f64], source: Encoding, target: Encoding) -> Vec<f64> {
    if source == target {
        return values.to_vec();
    }
    from_matrix(&to_matrix(values, source), target)
}

fn quat_matrix(x: f64, y: f64, z: f64, w: f64) -> Matrix {
    let norm = (x * x + y * y + z * z + w * w).sqrt();
    if norm <= EPS {
        return EYE;
    }
    let (x, y, z, w) = (x / norm, y / norm, z / norm, w / norm);
    [
        [
            1.0 - 2.0 * (y * y + z * z),
            2.0 * (x * y - w * z),
            2.0 * (x * z + w * y),
        ],
        [
            2.0 * (x * y + w * z),
            1.0 - 2.0 * (x * x + z * z),
            2.0 * (y * z - w * x),
        ],
        [
            2.0 * (x * z - w * y),
            2.0 * (y * z + w * x),
            1.0 - 2.0 * (x * x + y * y),
        ],
    ]
}

fn unit(v: [f64; 3]) -> [f64; 3] {
    let norm = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt().max(EPS);
    [v[0] / norm, v[1] / norm, v[2] / norm]
}

fn gram_schmidt(a1: [f64; 3], a2: [f64; 3]) -> Matrix {
    let b1 = unit(a1);
    let dot = b1[0] * a2[0] + b1[1] * a2[1] + b1[2] * a2[2];
    let b2 = unit([
        a2[0] - dot * b1[0],
        a2[1] - dot * b1[1],
        a2[2] - dot * b1[2],
    ]);
    let b3 = [
        b1[1] * b2[2] - b1[2] * b2[1],
        b1[2] * b2[0] - b1[0] * b2[2],
        b1[0] * b2[1] - b1[1] * b2[0],
    ];
    [
        [b1[0], b2[0], b3[0]],
        [b1[1], b2[1], b3[1]],
        [b1[2], b2[2], b3[2]],
    ]
}

/// The rotation matrix `v` encodes.
pub fn to_matrix(v: &[f64], encoding: Encoding) -> Matrix {
    match encoding {
        Encoding::QuatXyzw => quat_matrix(v[0], v[1], v[2], v[3]),
        Encoding::QuatWxyz => quat_matrix(v[1], v[2], v[3], v[0]),
        Encoding::AxisAngle => {
            let angle = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            if angle <= EPS {
                return EYE;
            }
            let (x, y, z) = (v[0] / angle, v[1] / angle, v[2] / angle);
            let half = angle / 2.0;
            let s = half.sin();
            quat_matrix(x * s, y * s, z * s, half.cos())
        }
        Encoding::EulerXyz => {
            let (sr, cr) = (v[0].sin(), v[0].cos());
            let (sp, cp) = (v[1].sin(), v[1].cos());
            let (sy, cy) = (v[2].sin(), v[2].cos());
            [
                [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                [-sp, cp * sr, cp * cr],
            ]
        }
        Encoding::Rot6d => gram_schmidt([v[0], v[1], v[2]], [v[3], v[4], v[5]]),
        Encoding::Rot6dRowMajor => gram_schmidt([v[0], v[2], v[4]], [v[1], v[3], v[5]]),
        Encoding::Matrix => [[v[0], v[1], v[2]], [v[3], v[4], v[5]], [v[6], v[7], v[8]]],
    }
}

/// (roll, pitch, yaw) of a rotation matrix, pitch in [-pi/2, pi/2].
///
/// Near pitch = +-pi/2 (gimbal lock) the entries roll and yaw are usually read from shrink to
/// rounding noise, so yaw is read first, then roll from entries that stay of size one given
/// that yaw: the angles always rebuild the matrix. At the lock itself yaw is taken as 0, as
/// scipy does.
fn matrix_euler_xyz(m: &Matrix) -> [f64; 3] {
    let [[m00, m01, m02], [m10, m11, m12], [m20, _, _]] = *m;
    let cos_pitch = (m00 * m00 + m10 * m10).sqrt();
    let pitch = (-m20).atan2(cos_pitch);
    let yaw = if cos_pitch > 1e-9 {
        m10.atan2(m00)
    } else {
        0.0
    };
    let (sin_yaw, cos_yaw) = (yaw.sin(), yaw.cos());
    // Rz(yaw)^T R = Ry(pitch) Rx(roll), whose middle row is (0, cos roll, -sin roll).
    let roll = (sin_yaw * m02 - cos_yaw * m12).atan2(cos_yaw * m11 - sin_yaw * m01);
    [roll, pitch, yaw]
}

/// (x, y, z, w) of a rotation matrix, with w >= 0 (Shepperd's method).
fn matrix_quat(m: &Matrix) -> [f64; 4] {
    let [[m00, m01, m02], [m10, m11, m12], [m20, m21, m22]] = *m;
    let trace = m00 + m11 + m22;
    let (mut x, mut y, mut z, mut w);
    if trace > 0.0 {
        let s = 2.0 * (trace + 1.0).sqrt();
        (x, y, z, w) = ((m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s, s / 4.0);
    } else if m00 > m11 && m00 > m22 {
        let s = 2.0 * (1.0 + m00 - m11 - m22).sqrt();
        (x, y, z, w) = (s / 4.0, (m01 + m10) / s, (m02 + m20) / s, (m21 - m12) / s);
    } else if m11 > m22 {
        let s = 2.0 * (1.0 + m11 - m00 - m22).sqrt();
        (x, y, z, w) = ((m01 + m10) / s, s / 4.0, (m12 + m21) / s, (m02 - m20) / s);
    } else {
        let s = 2.0 * (1.0 + m22 - m00 - m11).sqrt();
        (x, y, z, w) = ((m02 + m20) / s, (m12 + m21) / s, s / 4.0, (m10 - m01) / s);
    }
    if w < 0.0 {
        (x, y, z, w) = (-x, -y, -z, -w);
    }
    let norm = (x * x + y * y + z * z + w * w).sqrt();
    [x / norm, y / norm, z / norm, w / norm]
}

/// A rotation matrix written in `encoding`.
pub fn from_matrix(m: &Matrix, encoding: Encoding) -> Vec<f64> {
    match encoding {
        Encoding::QuatXyzw => matrix_quat(m).to_vec(),
        Encoding::QuatWxyz => {
            let [x, y, z, w] = matrix_quat(m);
            vec![w, x, y, z]
        }
        Encoding::AxisAngle => {
            let [x, y, z, w] = matrix_quat(m);
            let sin_half = (x * x + y * y + z * z).sqrt();
            if sin_half <= EPS {
                return vec![0.0; 3];
            }
            let factor = 2.0 * sin_half.atan2(w) / sin_half;
            vec![x * factor, y * factor, z * factor]
        }
        Encoding::EulerXyz => matrix_euler_xyz(m).to_vec(),
        Encoding::Rot6d => vec![m[0][0], m[1][0], m[2][0], m[0][1], m[1][1], m[2][1]],
        Encoding::Rot6dRowMajor => vec![m[0][0], m[0][1], m[1][0], m[1][1], m[2][0], m[2][1]],
        Encoding::Matrix => m.iter().flatten().copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quaternion_of_a_third_turn_about_the_diagonal_cycles_the_axes() {
        let rot6d = convert(&[0.5, 0.5, 0.5, 0.5], Encoding::QuatXyzw, Encoding::Rot6d);
        let expected = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        for (got, want) in rot6d.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{rot6d:?}");
        }
    }

    #[test]
    fn every_encoding_round_trips_through_the_matrix() {
        let all = [
            Encoding::QuatXyzw,
            Encoding::QuatWxyz,
            Encoding::AxisAngle,
            Encoding::EulerXyz,
            Encoding::Rot6d,
            Encoding::Rot6dRowMajor,
            Encoding::Matrix,
        ];
        let start = [0.3, -0.2, 0.9];
        let reference = to_matrix(&start, Encoding::AxisAngle);
        for encoding in all {
            let back = to_matrix(&from_matrix(&reference, encoding), encoding);
            for (row, want) in back.iter().zip(&reference) {
                for (got, want) in row.iter().zip(want) {
                    assert!((got - want).abs() < 1e-9, "{encoding:?}");
                }
            }
        }
    }
}
