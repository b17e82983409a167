//! What gates beyond podsReady and allocatable observe: gathered by the
//! runtime before each decision (from its caches, or read from the API or a
//! metrics endpoint for the gates that need it) and handed to the pure
//! decision whole, so every gate stays a pure function of one snapshot.
//!
//! Each gate that needs evidence adds a field here (borrowed from what the
//! runtime holds, like the views), filled by the operator's snapshot and by
//! the test model.

use std::marker::PhantomData;

/// Evidence for the gates, borrowed for one decision.
#[derive(Debug, Clone, Copy, Default)]
pub struct Evidence<'a> {
    _borrowed: PhantomData<&'a ()>,
    /// resourceSlices, claims, deviceHealth, deviceTaints, and the probes
    /// and quarantine the rollout keeps: see [`crate::devices`]. `None`
    /// when the runtime gathers none.
    pub devices: Option<&'a crate::devices::DeviceEvidence<'a>>,
    /// What the probe, logs and prometheus gates observe.
    pub proof: Option<&'a super::proof::ProofEvidence>,
    /// The pods on the nodes the rollout holds in maintenance
    /// (`spec.nodeMaintenance.drain`; not a gate's, but read the same way).
    pub drain: Option<&'a crate::drain::DrainEvidence>,
}

impl<'a> Evidence<'a> {
    /// Evidence carrying what the proof gates observe.
    pub fn with_proof(mut self, proof: &'a super::proof::ProofEvidence) -> Self {
        self.proof = Some(proof);
        self
    }

    /// Evidence carrying the pods of the nodes in maintenance.
    pub fn with_drain(mut self, drain: &'a crate::drain::DrainEvidence) -> Self {
        self.drain = Some(drain);
        self
    }
}
