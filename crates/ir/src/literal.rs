//! The exact value of a constant: a float, an integer or a bool, whichever the constant's dtype
//! holds, so an i64 above 2^53 is kept to the last bit; and the text form of floats ([`format_f64`]).

use crate::elementwise::Elem;
use crate::DType;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A constant's value. Its kind matches the dtype of the node (or plan value) that holds it:
/// `Float` for f32/f16/bf16 (kept in f64, rounded to the dtype where it is stored), `Int` for
/// i32/i64 (within the dtype's range), `Bool` for bool.
pub type Literal = Elem<f64>;

impl Literal {
    /// `value` converted to `dtype` with cast semantics: floats kept, float -> int truncates
    /// toward zero and saturates (NaN -> 0, as `as` does), so an integral `value` converts
    /// exactly; anything -> bool is `!= 0`.
    pub fn of_f64(value: f64, dtype: DType) -> Literal {
        Literal::Float(value).to_dtype(dtype)
    }

    /// This value converted to `dtype` with cast semantics (int -> narrower int wraps, int ->
    /// float rounds to nearest, bool -> number is 0/1), so its kind matches `dtype`.
    pub fn to_dtype(self, dtype: DType) -> Literal {
        match (dtype, self) {
            (d, Literal::Float(v)) if d.is_float() => Literal::Float(v),
            (d, Literal::Int(i)) if d.is_float() => Literal::Float(i as f64),
            (d, Literal::Bool(b)) if d.is_float() => Literal::Float(b as u8 as f64),
            (DType::I32, Literal::Float(v)) => Literal::Int((v as i32).into()),
            (DType::I32, Literal::Int(i)) => Literal::Int((i as i32).into()),
            (DType::I64, Literal::Float(v)) => Literal::Int(v as i64),
            (DType::I64, Literal::Int(i)) => Literal::Int(i),
            (DType::I32 | DType::I64, Literal::Bool(b)) => Literal::Int(b.into()),
            (DType::Bool, Literal::Float(v)) => Literal::Bool(v != 0.0),
            (DType::Bool, Literal::Int(i)) => Literal::Bool(i != 0),
            (DType::Bool, Literal::Bool(b)) => Literal::Bool(b),
            (DType::F32 | DType::F16 | DType::BF16, _) => unreachable!("float dtypes matched above"),
        }
    }

    /// Whether the kind is the one `dtype` holds (and an i32's value is in range).
    pub fn fits(self, dtype: DType) -> bool {
        self.to_dtype(dtype) == self || matches!(self, Literal::Float(v) if v.is_nan() && dtype.is_float())
    }

    /// A key that is equal exactly when the kind and the bits are (NaNs by payload, -0.0 apart
    /// from +0.0), for hashing and common-subexpression matching.
    pub fn bit_key(self) -> (u8, u64) {
        match self {
            Literal::Float(v) => (0, v.to_bits()),
            Literal::Int(i) => (1, i as u64),
            Literal::Bool(b) => (2, b as u64),
        }
    }

    /// The value as an f64 (bool as 0/1); integers above 2^53 round.
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(v) => v,
            Literal::Int(i) => i as f64,
            Literal::Bool(b) => b as u8 as f64,
        }
    }
}

/// Floats as in [`format_f64`] (with a decimal point or exponent), integers as integers, bools as
/// `true`/`false`.
impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Float(v) => f.write_str(&format_f64(*v)),
            Literal::Int(i) => write!(f, "{i}"),
            Literal::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// JSON: a finite float as a number with a decimal point or exponent, a non-finite one as the
/// string `"nan"`, `"inf"` or `"-inf"`, an integer as an integer, a bool as a bool; so every
/// value reads back exactly and as the same kind.
impl Serialize for Literal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Literal::Float(v) if v.is_finite() => s.serialize_f64(v),
            Literal::Float(v) => s.serialize_str(&format_f64(v)),
            Literal::Int(i) => s.serialize_i64(i),
            Literal::Bool(b) => s.serialize_bool(b),
        }
    }
}

impl<'de> Deserialize<'de> for Literal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Literal, D::Error> {
        d.deserialize_any(LiteralVisitor)
    }
}

struct LiteralVisitor;

impl Visitor<'_> for LiteralVisitor {
    type Value = Literal;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, a bool, or \"nan\", \"inf\", \"-inf\"")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Literal, E> {
        Ok(Literal::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Literal, E> {
        Ok(Literal::Int(i))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Literal, E> {
        i64::try_from(u).map(Literal::Int).map_err(|_| E::custom(format!("integer constant {u} is above i64's range")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Literal, E> {
        Ok(Literal::Float(v))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Literal, E> {
        match s {
            "nan" => Ok(Literal::Float(f64::NAN)),
            "inf" => Ok(Literal::Float(f64::INFINITY)),
            "-inf" => Ok(Literal::Float(f64::NEG_INFINITY)),
            _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
        }
    }

    /// Older dumps wrote non-finite floats as `null`; their value is lost, so they read as NaN.
    fn visit_unit<E: de::Error>(self) -> Result<Literal, E> {
        Ok(Literal::Float(f64::NAN))
    }
}

/// Shortest text that reads back to the same f64, with a decimal point or exponent so it reads
/// as a float; NaN and infinities spelled out.
pub fn format_f64(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else {
        let s = format!("{v:?}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_exactly_and_keeps_the_kind() {
        let big = (1i64 << 62) + 1;
        for lit in [
            Literal::Int(big),
            Literal::Int(i64::MIN),
            Literal::Int(2),
            Literal::Float(2.0),
            Literal::Float(-0.0),
            Literal::Float(0.1),
            Literal::Float(f64::INFINITY),
            Literal::Float(f64::NEG_INFINITY),
            Literal::Bool(true),
        ] {
            let text = serde_json::to_string(&lit).unwrap();
            let back: Literal = serde_json::from_str(&text).unwrap();
            assert_eq!(back, lit, "{text}");
            assert_eq!(back.as_f64().is_sign_negative(), lit.as_f64().is_sign_negative(), "{text}");
        }
        assert_eq!(serde_json::to_string(&Literal::Int(big)).unwrap(), "4611686018427387905");
        let nan: Literal = serde_json::from_str(&serde_json::to_string(&Literal::Float(f64::NAN)).unwrap()).unwrap();
        assert!(matches!(nan, Literal::Float(v) if v.is_nan()));
        assert!(serde_json::from_str::<Literal>("9223372036854775808").is_err());
        assert!(serde_json::from_str::<Literal>("\"one\"").is_err());
    }

    #[test]
    fn text_prints_ints_as_ints() {
        assert_eq!(Literal::Int((1 << 62) + 1).to_string(), "4611686018427387905");
        assert_eq!(Literal::Float(2.0).to_string(), "2.0");
        assert_eq!(Literal::Float(f64::NEG_INFINITY).to_string(), "-inf");
        assert_eq!(Literal::Bool(false).to_string(), "false");
    }

    #[test]
    fn conversion_follows_cast_semantics() {
        assert_eq!(Literal::of_f64(3.9, DType::I64), Literal::Int(3));
        assert_eq!(Literal::of_f64(-1e300, DType::I32), Literal::Int(i32::MIN.into()));
        assert_eq!(Literal::of_f64(f64::NAN, DType::I64), Literal::Int(0));
        assert_eq!(Literal::of_f64(0.5, DType::Bool), Literal::Bool(true));
        assert_eq!(Literal::Int(1 << 40).to_dtype(DType::I32), Literal::Int(0));
        assert_eq!(Literal::Bool(true).to_dtype(DType::BF16), Literal::Float(1.0));
        assert!(Literal::Int(5).fits(DType::I32));
        assert!(!Literal::Int(1 << 40).fits(DType::I32));
        assert!(!Literal::Float(1.0).fits(DType::I64));
        assert!(Literal::Float(f64::NAN).fits(DType::F32));
    }
}
