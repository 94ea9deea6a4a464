//! Go's `time.Time` as gob carries it: a GobEncoder whose bytes are `time.Time.MarshalBinary`.
//!
//! Layout (version 1): `01`, seconds since 0001-01-01 UTC (int64 BE), nanoseconds (int32 BE), zone
//! offset in minutes (int16 BE, -1 = UTC). Version 2 adds one byte of offset seconds. We always
//! write version 1 in UTC; `metav1.Time` uses the same encoding through the promoted methods.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::decode::{GobDecode, ValueDecoder};
use super::encode::{Encoder, GobEncode};
use super::types::{TypeId, WireType};
use super::wire::put_bytes;
use super::Error;

/// Seconds from 0001-01-01T00:00:00Z to the Unix epoch.
const UNIX_TO_INTERNAL: i64 = 62_135_596_800;

/// An instant as Go's `time.Time` (and `metav1.Time`) sends it over gob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoTime {
    /// Seconds since the Unix epoch (may be negative).
    pub unix_seconds: i64,
    /// Nanoseconds within the second, `0..1_000_000_000`.
    pub nanos: u32,
}

impl GoTime {
    /// The current time.
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }

    /// A time from Unix seconds and nanoseconds.
    pub fn from_unix(unix_seconds: i64, nanos: u32) -> Self {
        Self {
            unix_seconds,
            nanos,
        }
    }

    /// Parses `time.Time.MarshalBinary` output.
    pub fn from_binary(b: &[u8]) -> Result<Self, Error> {
        let version = *b.first().ok_or_else(|| Error::invalid("time: no data"))?;
        let want = match version {
            1 => 15,
            2 => 16,
            v => return Err(Error::invalid(format!("time: unsupported version {v}"))),
        };
        if b.len() != want {
            return Err(Error::invalid(format!(
                "time: {} bytes, want {want}",
                b.len()
            )));
        }
        let sec = i64::from_be_bytes(b[1..9].try_into().expect("8 bytes"));
        let nsec = i32::from_be_bytes(b[9..13].try_into().expect("4 bytes"));
        if !(0..1_000_000_000).contains(&nsec) {
            return Err(Error::invalid(format!(
                "time: nanoseconds {nsec} out of range"
            )));
        }
        Ok(Self {
            unix_seconds: sec.wrapping_sub(UNIX_TO_INTERNAL),
            nanos: nsec as u32,
        })
    }

    /// `time.Time.MarshalBinary` in UTC (version 1).
    pub fn to_binary(&self) -> [u8; 15] {
        let mut out = [0u8; 15];
        out[0] = 1;
        out[1..9].copy_from_slice(
            &self
                .unix_seconds
                .wrapping_add(UNIX_TO_INTERNAL)
                .to_be_bytes(),
        );
        out[9..13].copy_from_slice(&(self.nanos as i32).to_be_bytes());
        out[13..15].copy_from_slice(&(-1i16).to_be_bytes());
        out
    }

    /// RFC 3339 in UTC with whole seconds, as `metav1.Time` marshals to JSON.
    pub fn to_rfc3339(&self) -> String {
        let days = self.unix_seconds.div_euclid(86_400);
        let secs = self.unix_seconds.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.frac]Z` (UTC only), the form `metav1.Time` uses in JSON.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let rest = &s[19..];
        let (frac, tail) = match rest.strip_prefix('.') {
            Some(r) => {
                let digits = r.bytes().take_while(u8::is_ascii_digit).count();
                (&r[..digits], &r[digits..])
            }
            None => ("", rest),
        };
        if tail != "Z" {
            return None;
        }
        let mut nanos = 0u32;
        for (i, c) in frac.bytes().take(9).enumerate() {
            nanos += u32::from(c - b'0') * 10u32.pow(8 - i as u32);
        }
        Some(Self {
            unix_seconds: days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se,
            nanos,
        })
    }
}

impl From<SystemTime> for GoTime {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self {
                unix_seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    Self {
                        unix_seconds: -s,
                        nanos: 0,
                    }
                } else {
                    Self {
                        unix_seconds: -s - 1,
                        nanos: 1_000_000_000 - n,
                    }
                }
            }
        }
    }
}

impl From<GoTime> for SystemTime {
    fn from(t: GoTime) -> Self {
        if t.unix_seconds >= 0 {
            UNIX_EPOCH + Duration::new(t.unix_seconds as u64, t.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.unix_seconds.unsigned_abs())
                + Duration::from_nanos(u64::from(t.nanos))
        }
    }
}

impl GobDecode for GoTime {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        GoTime::from_binary(d.read_marshaled(ty)?)
    }
}

impl GobEncode for GoTime {
    fn gob_type(enc: &mut Encoder) -> TypeId {
        enc.define_type::<Self>(|_| WireType::GobEncoder {
            name: "Time".into(),
        })
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_bytes(out, &self.to_binary());
    }
    fn is_zero(&self) -> bool {
        self.unix_seconds == -UNIX_TO_INTERNAL && self.nanos == 0
    }
}

// Howard Hinnant's days <-> civil date algorithms (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_example_round_trips() {
        // 2018-02-01T14:30:00Z from the protocol notes.
        let bytes = [
            0x01, 0, 0, 0, 0x0E, 0xD2, 0x05, 0x1B, 0x68, 0, 0, 0, 0, 0xFF, 0xFF,
        ];
        let t = GoTime::from_binary(&bytes).unwrap();
        assert_eq!(t.to_rfc3339(), "2018-02-01T14:30:00Z");
        assert_eq!(t.to_binary(), bytes);
        assert_eq!(GoTime::parse_rfc3339("2018-02-01T14:30:00Z"), Some(t));
    }

    #[test]
    fn system_time_round_trips() {
        let now = SystemTime::now();
        assert_eq!(SystemTime::from(GoTime::from(now)), now);
    }
}
