//! The fake cloud's compact instances: what [`FakeInstance`] says, in about 80 bytes held
//! inline in the cloud's map, where a whole [`FakeInstance`] is 208 bytes plus a `String` for
//! its model's uuid, its zone, its nonce and its instance type.
//!
//! The few distinct model uuids, zones, instance types and nonce host tags are interned
//! ([`Names`]); a nonce of the provisioner's form, `HOST:UUID`, is held as the host's name
//! and the uuid's 16 bytes (any other text as it is); the rare fields (an age at launch, an
//! age the instance was given, the image it was started from) are boxed only when set. Every conversion is exact: a
//! [`FakeInstance`] stored and read back is equal to the one stored.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;
use std::time::Duration;

use rustc_hash::{FxBuildHasher, FxHasher};

use crate::model::{CapacityType, CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId};

/// An instance in the fake cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeInstance {
    /// Id, state, zone, tags.
    pub instance: CloudInstance,
    /// Belongs to another model or controller.
    pub foreign: bool,
    /// Its age at a time since the cloud's creation: `(when, age then)`.
    pub born: (Duration, Duration),
}

impl FakeInstance {
    /// Its age at `now` (since the cloud's creation).
    pub fn age_at(&self, now: Duration) -> Duration {
        self.born.1 + now.saturating_sub(self.born.0)
    }
}

/// An interned name: an index into [`Names`], or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Name(u32);

impl Name {
    /// No name (`None`).
    pub(super) const NONE: Name = Name(u32::MAX);
}

/// The distinct names the cloud's instances share, each kept once.
#[derive(Debug, Default)]
pub(super) struct Names {
    list: Vec<Box<str>>,
    /// Looked up on every start (its model, zone, type and nonce host), never iterated.
    index: HashMap<Box<str>, u32, FxBuildHasher>,
}

impl Names {
    /// `text`'s name, interned on first use.
    pub(super) fn intern(&mut self, text: &str) -> Name {
        if let Some(&i) = self.index.get(text) {
            return Name(i);
        }
        let i = u32::try_from(self.list.len()).expect("fewer than 4 billion distinct names");
        self.list.push(text.into());
        self.index.insert(text.into(), i);
        Name(i)
    }

    /// `text`'s name, or [`Name::NONE`].
    pub(super) fn intern_opt(&mut self, text: Option<&str>) -> Name {
        text.map_or(Name::NONE, |t| self.intern(t))
    }

    /// `text`'s name if it was ever interned (no name can match one never interned).
    pub(super) fn find(&self, text: &str) -> Option<Name> {
        self.index.get(text).map(|&i| Name(i))
    }

    /// The text of a name.
    pub(super) fn get(&self, name: Name) -> Option<&str> {
        self.list.get(name.0 as usize).map(|s| &**s)
    }
}

/// The length of a hyphenated uuid.
const UUID_LEN: usize = 36;

/// A nonce of the provisioner's form, `HOST:UUID` with the uuid hyphenated in lower case, split
/// into its host and the uuid's bytes; `None` for any other text (an upper-case or unhyphenated
/// uuid included, which could not be written back as it was).
fn split_nonce(text: &str) -> Option<(&str, [u8; 16])> {
    let at = text.len().checked_sub(UUID_LEN + 1)?;
    let (host, rest) = text.split_at_checked(at)?;
    let id: &[u8; UUID_LEN] = rest.strip_prefix(':')?.as_bytes().try_into().ok()?;
    if [8, 13, 18, 23].iter().any(|&i| id[i] != b'-') {
        return None;
    }
    let mut out = [0u8; 16];
    for (byte, &at) in out.iter_mut().zip(&HEX_PAIRS) {
        let (hi, lo) = (HEX[usize::from(id[at])], HEX[usize::from(id[at + 1])]);
        if (hi | lo) & 0xf0 != 0 {
            return None;
        }
        *byte = hi << 4 | lo;
    }
    Some((host, out))
}

/// Where each of a hyphenated uuid's 16 bytes is written (two hexadecimal digits).
const HEX_PAIRS: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// The value of each lower-case hexadecimal digit; 0xff for every other byte.
const HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// A start's nonce (the instance's `start` tag).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Nonce {
    None,
    /// `HOST:UUID`, the uuid hyphenated in lower case (the provisioner's nonces).
    Packed {
        host: Name,
        uuid: [u8; 16],
    },
    /// Any other text.
    Text(Box<str>),
}

impl Nonce {
    fn new(text: Option<&str>, names: &mut Names) -> Self {
        let Some(text) = text else { return Nonce::None };
        if let Some((host, uuid)) = split_nonce(text) {
            return Nonce::Packed { host: names.intern(host), uuid };
        }
        Nonce::Text(text.into())
    }

    /// Whether this is the nonce `text` (without writing it out).
    fn is(&self, text: &str, names: &Names) -> bool {
        match self {
            Nonce::None => false,
            Nonce::Text(t) => **t == *text,
            Nonce::Packed { host, uuid } => {
                split_nonce(text).is_some_and(|(h, id)| id == *uuid && names.get(*host) == Some(h))
            }
        }
    }

    fn text(&self, names: &Names) -> Option<String> {
        match self {
            Nonce::None => None,
            Nonce::Text(t) => Some(t.to_string()),
            Nonce::Packed { host, uuid } => {
                let host = names.get(*host).unwrap_or_default();
                let mut buf = uuid::Uuid::encode_buffer();
                let id = uuid::Uuid::from_bytes(*uuid).hyphenated().encode_lower(&mut buf);
                let mut out = String::with_capacity(host.len() + 1 + id.len());
                out.push_str(host);
                out.push(':');
                out.push_str(id);
                Some(out)
            }
        }
    }
}

/// What few instances have: the age an instance launched out of band had then, the age its
/// record was given, the image it was started from (a cloud that names one, issue 34).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rare {
    age_then: Duration,
    age: Option<Duration>,
    image: Name,
}

impl Default for Rare {
    fn default() -> Self {
        Self { age_then: Duration::ZERO, age: None, image: Name::NONE }
    }
}

/// One instance as the fake cloud keeps it (its id is the map's key).
#[derive(Debug, Clone)]
pub(super) struct Stored {
    machine: Option<MachineId>,
    nonce: Nonce,
    /// When it was launched, since the cloud's creation, in nanoseconds.
    born_at: u64,
    rare: Option<Box<Rare>>,
    model: Name,
    zone: Name,
    instance_type: Name,
    /// The call number of the client token it is known by in [`Tokens`]' hashed index
    /// ([`NO_CALL`]: none there).
    call: u16,
    /// Its state.
    pub(super) state: InstanceState,
    /// Belongs to another model or controller ([`FOREIGN`]), and the capacity it runs on
    /// when known ([`ON_DEMAND`], [`SPOT`]; issue 33), in one byte: the struct stays 80 bytes.
    bits: u8,
}

/// [`Stored::bits`]: another model's or controller's.
const FOREIGN: u8 = 1;
/// [`Stored::bits`]: on on-demand capacity.
const ON_DEMAND: u8 = 2;
/// [`Stored::bits`]: on spot capacity.
const SPOT: u8 = 4;

impl Stored {
    /// `f` kept compactly, with its id.
    pub(super) fn new(f: FakeInstance, names: &mut Names) -> (InstanceId, Self) {
        let FakeInstance { instance, foreign, born: (born_at, age_then) } = f;
        let CloudInstance { id, state, zone, tags, age, instance_type, capacity_type, image } = instance;
        let image = names.intern_opt(image.as_deref());
        let rare = (age_then != Duration::ZERO || age.is_some() || image != Name::NONE)
            .then(|| Box::new(Rare { age_then, age, image }));
        let stored = Self {
            machine: tags.machine,
            nonce: Nonce::new(tags.start.as_deref(), names),
            born_at: u64::try_from(born_at.as_nanos()).unwrap_or(u64::MAX),
            rare,
            model: names.intern_opt(tags.model.as_deref()),
            zone: names.intern_opt(zone.as_deref()),
            instance_type: names.intern_opt(instance_type.as_deref()),
            call: NO_CALL,
            state,
            bits: if foreign { FOREIGN } else { 0 },
        };
        let mut stored = stored;
        stored.set_capacity(capacity_type);
        (id, stored)
    }

    /// A pending instance a start made now (`born_at`, since the cloud's creation), tagged
    /// `tags`, in `zone`: [`Stored::new`] without the copies of its strings.
    pub(super) fn pending(
        tags: &InstanceTags,
        zone: Option<&str>,
        instance_type: Option<&str>,
        born_at: Duration,
        names: &mut Names,
    ) -> Self {
        Self {
            machine: tags.machine.clone(),
            nonce: Nonce::new(tags.start.as_deref(), names),
            born_at: u64::try_from(born_at.as_nanos()).unwrap_or(u64::MAX),
            rare: None,
            model: names.intern_opt(tags.model.as_deref()),
            zone: names.intern_opt(zone),
            instance_type: names.intern_opt(instance_type),
            call: NO_CALL,
            state: InstanceState::Pending,
            bits: 0,
        }
    }

    /// Records the image it was started from (interned once).
    pub(super) fn set_image(&mut self, image: Option<&str>, names: &mut Names) {
        let image = names.intern_opt(image);
        if image != Name::NONE || self.rare.is_some() {
            self.rare.get_or_insert_with(Box::default).image = image;
        }
    }

    /// Whether it belongs to another model or controller.
    pub(super) fn foreign(&self) -> bool {
        self.bits & FOREIGN != 0
    }

    /// The capacity it runs on, when known.
    pub(super) fn capacity(&self) -> Option<CapacityType> {
        match self.bits & (ON_DEMAND | SPOT) {
            ON_DEMAND => Some(CapacityType::OnDemand),
            SPOT => Some(CapacityType::Spot),
            _ => None,
        }
    }

    /// Records the capacity it runs on.
    pub(super) fn set_capacity(&mut self, capacity: Option<CapacityType>) {
        let bits = match capacity {
            None => 0,
            Some(CapacityType::OnDemand) => ON_DEMAND,
            Some(CapacityType::Spot) => SPOT,
        };
        self.bits = (self.bits & FOREIGN) | bits;
    }

    /// The machine tagged on it.
    pub(super) fn machine(&self) -> Option<&MachineId> {
        self.machine.as_ref()
    }

    /// Whether it carries the identity of the model named `model` (and was not launched as
    /// foreign).
    pub(super) fn ours(&self, model: Option<Name>) -> bool {
        !self.foreign() && model.is_some_and(|m| m == self.model)
    }

    /// Whether `token` is the client token `MACHINE/NONCE/CALL` of this instance's machine and
    /// nonce and of `call`.
    fn token_is(&self, token: &str, call: u16, names: &Names) -> bool {
        let Some(machine) = &self.machine else { return false };
        let Some(rest) = token.strip_prefix(machine.as_str()).and_then(|r| r.strip_prefix('/')) else {
            return false;
        };
        let Some((nonce, n)) = rest.rsplit_once('/') else { return false };
        // `n` is `call` written as `to_string` writes it (no sign, no leading zero).
        let canonical = !n.starts_with('+') && (n == "0" || !n.starts_with('0'));
        canonical && n.parse() == Ok(call) && self.nonce.is(nonce, names)
    }

    /// Replaces its tags.
    pub(super) fn retag(&mut self, tags: InstanceTags, names: &mut Names) {
        self.model = names.intern_opt(tags.model.as_deref());
        self.machine = tags.machine;
        self.nonce = Nonce::new(tags.start.as_deref(), names);
    }

    /// Strips its model's identity.
    pub(super) fn release(&mut self) {
        self.model = Name::NONE;
    }

    /// Its age at `now` (since the cloud's creation).
    pub(super) fn age_at(&self, now: Duration) -> Duration {
        let then = self.rare.as_ref().map_or(Duration::ZERO, |r| r.age_then);
        then + now.saturating_sub(Duration::from_nanos(self.born_at))
    }

    /// The instance as the cloud answers for it.
    pub(super) fn instance(&self, id: &InstanceId, names: &Names) -> CloudInstance {
        let text = |n: Name| names.get(n).map(str::to_owned);
        CloudInstance {
            id: id.clone(),
            state: self.state,
            zone: text(self.zone),
            tags: InstanceTags {
                model: text(self.model),
                machine: self.machine.clone(),
                start: self.nonce.text(names),
            },
            age: self.rare.as_ref().and_then(|r| r.age),
            instance_type: text(self.instance_type),
            capacity_type: self.capacity(),
            image: self.rare.as_ref().and_then(|r| text(r.image)),
        }
    }

    /// The instance in its full form (snapshots).
    pub(super) fn fake(&self, id: &InstanceId, names: &Names) -> FakeInstance {
        let age_then = self.rare.as_ref().map_or(Duration::ZERO, |r| r.age_then);
        FakeInstance {
            instance: self.instance(id, names),
            foreign: self.foreign(),
            born: (Duration::from_nanos(self.born_at), age_then),
        }
    }
}

/// No call number: the instance's client token, if any, is kept as text.
const NO_CALL: u16 = u16::MAX;

/// FxHash (`rustc-hash`): client tokens are the model's own, never adversarial, and a fixed
/// hash keeps runs deterministic.
fn fx(token: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(token.as_bytes());
    h.finish()
}

/// One model's client tokens and the instance each made, looked up, never iterated. A token
/// of the provisioner's form, `MACHINE/NONCE/CALL` with its instance's machine and nonce, is
/// kept as its hash only (the instance holds the call number, and a hit is checked against
/// the instance: exact, not probable); any other token, one whose hash is taken, or one whose
/// instance was retagged, as its text.
#[derive(Debug, Default)]
pub(super) struct Tokens {
    hashed: HashMap<u64, InstanceId, FxBuildHasher>,
    text: HashMap<Box<str>, InstanceId, FxBuildHasher>,
}

impl Tokens {
    /// The instance `token` made, if any.
    pub(super) fn get<'a>(
        &'a self,
        token: &str,
        instances: &BTreeMap<InstanceId, Stored>,
        names: &Names,
    ) -> Option<&'a InstanceId> {
        // Most clouds' tokens are all hashed: no text to hash the token for.
        if !self.text.is_empty() {
            if let Some(id) = self.text.get(token) {
                return Some(id);
            }
        }
        let id = self.hashed.get(&fx(token))?;
        let i = instances.get(id)?;
        (i.call != NO_CALL && i.token_is(token, i.call, names)).then_some(id)
    }

    /// `token` made instance `id` (`stored`).
    pub(super) fn insert(&mut self, token: &str, id: InstanceId, stored: &mut Stored, names: &Names) {
        let call = token.rsplit_once('/').and_then(|(_, n)| n.parse::<u16>().ok()).filter(|&c| c != NO_CALL);
        if let Some(call) = call.filter(|&c| stored.call == NO_CALL && stored.token_is(token, c, names)) {
            if let std::collections::hash_map::Entry::Vacant(e) = self.hashed.entry(fx(token)) {
                e.insert(id);
                stored.call = call;
                return;
            }
        }
        self.text.insert(token.into(), id);
    }

    /// Instance `id` (`stored`) is about to be retagged: its token, if hashed here, is kept as
    /// text from now on (its check against the instance would fail once its tags change).
    pub(super) fn before_retag(&mut self, id: &InstanceId, stored: &Stored, names: &Names) {
        if stored.call == NO_CALL {
            return;
        }
        let (Some(machine), Some(nonce)) = (&stored.machine, stored.nonce.text(names)) else { return };
        let token = format!("{machine}/{nonce}/{}", stored.call);
        let h = fx(&token);
        if self.hashed.get(&h) == Some(id) {
            self.hashed.remove(&h);
            self.text.insert(token.into(), id.clone());
        }
    }
}

/// Forgets that an instance's token is hashed (after [`Tokens::before_retag`] for every model).
pub(super) fn token_moved(stored: &mut Stored) {
    stored.call = NO_CALL;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(start: Option<&str>, age_then: Duration, age: Option<Duration>) -> FakeInstance {
        FakeInstance {
            instance: CloudInstance {
                id: InstanceId::new("i-7"),
                state: InstanceState::Running,
                zone: Some("az1".into()),
                tags: InstanceTags {
                    model: Some("model-uuid".into()),
                    machine: Some(MachineId::new("0/lxd/3")),
                    start: start.map(str::to_owned),
                },
                age,
                instance_type: Some("m5.large".into()),
                capacity_type: None,
                image: Some("img-1".into()),
            },
            foreign: false,
            born: (Duration::from_nanos(1_234_567_891), age_then),
        }
    }

    #[test]
    fn an_instance_stored_compactly_reads_back_equal() {
        let mut names = Names::default();
        let cases = [
            fake(Some("machine-0:0b5e7c1a-3f7d-4a51-9c2e-6d8f0a1b2c3d"), Duration::ZERO, None),
            fake(Some("host:with:colons:0b5e7c1a-3f7d-4a51-9c2e-6d8f0a1b2c3d"), Duration::from_secs(9), None),
            fake(Some("machine-0:0B5E7C1A-3F7D-4A51-9C2E-6D8F0A1B2C3D"), Duration::ZERO, Some(Duration::from_secs(2))),
            fake(Some("machine-0:0b5e7c1a3f7d4a519c2e6d8f0a1b2c3d"), Duration::ZERO, None),
            fake(Some("not a nonce"), Duration::ZERO, None),
            fake(Some(""), Duration::ZERO, None),
            fake(None, Duration::ZERO, None),
        ];
        for f in cases {
            let (id, stored) = Stored::new(f.clone(), &mut names);
            assert_eq!(stored.fake(&id, &names), f);
            if f.born.1.is_zero() && f.instance.age.is_none() {
                let i = &f.instance;
                let mut pending =
                    Stored::pending(&i.tags, i.zone.as_deref(), i.instance_type.as_deref(), f.born.0, &mut names);
                pending.set_image(i.image.as_deref(), &mut names);
                let mut want = f.clone();
                want.instance.state = InstanceState::Pending;
                assert_eq!(pending.fake(&id, &names), want);
            }
        }
        let mut spot = fake(None, Duration::ZERO, None);
        spot.foreign = true;
        spot.instance.capacity_type = Some(crate::model::CapacityType::Spot);
        let (id, stored) = Stored::new(spot.clone(), &mut names);
        assert_eq!(stored.fake(&id, &names), spot);
        let mut bare = fake(None, Duration::ZERO, None);
        bare.instance.zone = None;
        bare.instance.tags = InstanceTags::default();
        bare.instance.instance_type = None;
        let (id, stored) = Stored::new(bare.clone(), &mut names);
        assert_eq!(stored.fake(&id, &names), bare);
        assert!(std::mem::size_of::<Stored>() <= 80, "{} bytes", std::mem::size_of::<Stored>());
    }

    #[test]
    fn a_token_is_found_exactly_hashed_or_as_text() {
        let mut names = Names::default();
        let nonce = "machine-0:0b5e7c1a-3f7d-4a51-9c2e-6d8f0a1b2c3d";
        let mut instances = BTreeMap::new();
        let mut tokens = Tokens::default();
        let (id, mut stored) = Stored::new(fake(Some(nonce), Duration::ZERO, None), &mut names);
        let token = format!("0/lxd/3/{nonce}/2");
        tokens.insert(&token, id.clone(), &mut stored, &names);
        assert!(tokens.text.is_empty(), "a token of the provisioner's form is hashed");
        instances.insert(id.clone(), stored.clone());
        assert_eq!(tokens.get(&token, &instances, &names), Some(&id));
        for other in [format!("0/lxd/3/{nonce}/02"), format!("0/lxd/3/{nonce}/+2"), format!("0/lxd/3/{nonce}/3")] {
            assert_eq!(tokens.get(&other, &instances, &names), None, "{other}");
        }
        // Another form is kept as text.
        let (_, mut stored2) = Stored::new(fake(Some("free text"), Duration::ZERO, None), &mut names);
        let id2 = InstanceId::new("i-8");
        tokens.insert("token-1", id2.clone(), &mut stored2, &names);
        instances.insert(id2.clone(), stored2);
        assert_eq!(tokens.get("token-1", &instances, &names), Some(&id2));
        // A retagged instance keeps its token, as text.
        tokens.before_retag(&id, &stored, &names);
        token_moved(&mut stored);
        stored.retag(InstanceTags::default(), &mut names);
        instances.insert(id.clone(), stored);
        assert_eq!(tokens.get(&token, &instances, &names), Some(&id));
    }

    #[test]
    fn ours_needs_the_same_model_and_not_foreign() {
        let mut names = Names::default();
        let (_, mut stored) = Stored::new(fake(None, Duration::ZERO, None), &mut names);
        assert!(stored.ours(names.find("model-uuid")));
        assert!(!stored.ours(names.find("other")));
        stored.release();
        assert!(!stored.ours(names.find("model-uuid")));
    }
}
