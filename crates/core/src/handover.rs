//! One node's handover between the target DaemonSet and the canary
//! DaemonSet under the `Selector` strategy
//! (`docs/design/selector-strategy.md`).
//!
//! The node's handover label holds where the node is, and each DaemonSet's
//! node affinity reads it: the target runs where the label is absent or
//! `surge`, the canary where it is `surge` or `new`. So one label write moves
//! a node one state, the DaemonSet controller does the deletions and
//! creations, and the state is always read back from the cluster: nothing is
//! remembered, a repeated decision writes the same value again.
//!
//! Device plugins go break-before-make (absent, `drain`, `new`): two plugins
//! registering one resource confuse the kubelet. DRA drivers that support
//! the kubelet's rolling update go make-before-break (absent, `surge`,
//! `new`): the new instance serves before the old one goes. A revert walks
//! the same states back.

/// Where a node is in its handover: the value of its handover label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HandoverState {
    /// No label: the target's (old) agent only.
    Old,
    /// Neither agent: the old one is being deleted, the new one not created.
    Drain,
    /// Both agents: the new one starts beside the old one.
    Surge,
    /// The canary's (new) agent only.
    New,
}

/// A handover label value this operator did not write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownHandoverValue(pub String);

impl std::fmt::Display for UnknownHandoverValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "handover label value {:?} is none of drain, surge, new",
            self.0
        )
    }
}

impl HandoverState {
    /// The label's value (`None`: no label).
    pub fn label_value(self) -> Option<&'static str> {
        match self {
            HandoverState::Old => None,
            HandoverState::Drain => Some("drain"),
            HandoverState::Surge => Some("surge"),
            HandoverState::New => Some("new"),
        }
    }

    /// The state a node's label value says.
    pub fn of_label(value: Option<&str>) -> Result<Self, UnknownHandoverValue> {
        match value {
            None => Ok(HandoverState::Old),
            Some("drain") => Ok(HandoverState::Drain),
            Some("surge") => Ok(HandoverState::Surge),
            Some("new") => Ok(HandoverState::New),
            Some(other) => Err(UnknownHandoverValue(other.to_string())),
        }
    }

    /// The target DaemonSet runs on the node (its term: `NotIn [drain, new]`).
    pub fn target_runs(self) -> bool {
        matches!(self, HandoverState::Old | HandoverState::Surge)
    }

    /// The canary DaemonSet runs on the node (its term: `In [surge, new]`).
    pub fn canary_runs(self) -> bool {
        matches!(self, HandoverState::Surge | HandoverState::New)
    }
}

/// In which order a node's two agents trade places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoverOrder {
    /// The old agent is gone before the new one is created (device plugins).
    BreakBeforeMake,
    /// The new agent serves before the old one is deleted (DRA drivers with
    /// the kubelet's rolling update).
    MakeBeforeBreak,
}

impl From<saferollout_api::HandoverOrder> for HandoverOrder {
    fn from(o: saferollout_api::HandoverOrder) -> Self {
        match o {
            saferollout_api::HandoverOrder::BreakBeforeMake => HandoverOrder::BreakBeforeMake,
            saferollout_api::HandoverOrder::MakeBeforeBreak => HandoverOrder::MakeBeforeBreak,
        }
    }
}

/// Which agent the node should end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    /// The canary's: the rollout goes forward.
    New,
    /// The target's: a revert, or a node let go by its stage.
    Old,
}

/// What the node shows of its agents now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeAgents {
    /// A pod of the target is on the node (terminating ones included: the
    /// old agent has not let go of the devices until it is gone).
    pub old_present: bool,
    /// The target's pod serves: Ready, and for a make-before-break driver
    /// the node's pool is published by it.
    pub old_serving: bool,
    /// A pod of the canary is on the node (terminating ones included).
    pub new_present: bool,
    /// The canary's pod serves (as `old_serving`).
    pub new_serving: bool,
}

impl NodeAgents {
    fn serving_in(&self, state: HandoverState) -> bool {
        (state.target_runs() && self.old_serving) || (state.canary_runs() && self.new_serving)
    }
}

/// Why a node waits before its next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoverWait {
    /// Break-before-make: the agent leaving is still on the node.
    Leaving,
    /// Make-before-break: the agent arriving does not serve yet.
    Arriving,
}

/// The next thing to do on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoverStep {
    /// The node is where it should be.
    Done,
    /// Nothing to write until the cluster moves.
    Wait(HandoverWait),
    /// Write the label to `to`. `costs` says whether the write takes a
    /// `maxUnavailable` slot: the node serves now and will not right after
    /// the write (its serving agent is the one the write removes).
    Move { to: HandoverState, costs: bool },
}

/// The next step of one node from `state` toward `toward`, in `order`.
pub fn next_step(
    state: HandoverState,
    toward: Toward,
    order: HandoverOrder,
    agents: NodeAgents,
) -> HandoverStep {
    use HandoverOrder::*;
    use HandoverState::*;
    let (to, wait) = match (toward, order, state) {
        (Toward::New, _, New) | (Toward::Old, _, Old) => return HandoverStep::Done,
        (Toward::New, BreakBeforeMake, Old) => (Drain, None),
        (Toward::New, BreakBeforeMake, Drain) => {
            (New, agents.old_present.then_some(HandoverWait::Leaving))
        }
        (Toward::New, MakeBeforeBreak, Old) => (Surge, None),
        (Toward::New, MakeBeforeBreak, Surge) => {
            (New, (!agents.new_serving).then_some(HandoverWait::Arriving))
        }
        (Toward::Old, BreakBeforeMake, New) => (Drain, None),
        (Toward::Old, BreakBeforeMake, Drain) => {
            (Old, agents.new_present.then_some(HandoverWait::Leaving))
        }
        (Toward::Old, MakeBeforeBreak, New) => (Surge, None),
        (Toward::Old, MakeBeforeBreak, Surge) => {
            (Old, (!agents.old_serving).then_some(HandoverWait::Arriving))
        }
        // A state the other order left (the order changed with the agent's
        // kind, or a revert met a node mid-way): straight to the end, both
        // agents' pods being there or neither.
        (Toward::New, BreakBeforeMake, Surge) | (Toward::New, MakeBeforeBreak, Drain) => {
            (New, None)
        }
        (Toward::Old, BreakBeforeMake, Surge) | (Toward::Old, MakeBeforeBreak, Drain) => {
            (Old, None)
        }
    };
    match wait {
        Some(why) => HandoverStep::Wait(why),
        None => HandoverStep::Move {
            to,
            costs: agents.serving_in(state) && !agents.serving_in(to),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::HandoverOrder::*;
    use super::HandoverState::*;
    use super::*;

    const STATES: [HandoverState; 4] = [Old, Drain, Surge, New];

    fn serving_old() -> NodeAgents {
        NodeAgents {
            old_present: true,
            old_serving: true,
            ..NodeAgents::default()
        }
    }

    fn serving_new() -> NodeAgents {
        NodeAgents {
            new_present: true,
            new_serving: true,
            ..NodeAgents::default()
        }
    }

    fn both_serving() -> NodeAgents {
        NodeAgents {
            old_present: true,
            old_serving: true,
            new_present: true,
            new_serving: true,
        }
    }

    #[test]
    fn label_values_round_trip_and_unknown_ones_are_refused() {
        for s in STATES {
            assert_eq!(HandoverState::of_label(s.label_value()), Ok(s));
        }
        let err = HandoverState::of_label(Some("both")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "handover label value \"both\" is none of drain, surge, new"
        );
    }

    #[test]
    fn the_two_daemonsets_split_the_states_as_their_terms_say() {
        let runs: Vec<_> = STATES
            .iter()
            .map(|s| (s.target_runs(), s.canary_runs()))
            .collect();
        assert_eq!(
            runs,
            [(true, false), (false, false), (true, true), (false, true)]
        );
    }

    #[test]
    fn a_device_plugin_breaks_before_it_makes_and_the_break_costs_a_slot() {
        assert_eq!(
            next_step(Old, Toward::New, BreakBeforeMake, serving_old()),
            HandoverStep::Move {
                to: Drain,
                costs: true
            }
        );
        // The old pod is terminating: still on the node, so no new one yet.
        let leaving = NodeAgents {
            old_present: true,
            ..NodeAgents::default()
        };
        assert_eq!(
            next_step(Drain, Toward::New, BreakBeforeMake, leaving),
            HandoverStep::Wait(HandoverWait::Leaving)
        );
        assert_eq!(
            next_step(Drain, Toward::New, BreakBeforeMake, NodeAgents::default()),
            HandoverStep::Move {
                to: New,
                costs: false
            }
        );
        assert_eq!(
            next_step(New, Toward::New, BreakBeforeMake, NodeAgents::default()),
            HandoverStep::Done
        );
    }

    #[test]
    fn a_device_plugin_whose_agent_is_down_already_breaks_for_free() {
        let crashing = NodeAgents {
            old_present: true,
            ..NodeAgents::default()
        };
        assert_eq!(
            next_step(Old, Toward::New, BreakBeforeMake, crashing),
            HandoverStep::Move {
                to: Drain,
                costs: false
            }
        );
    }

    #[test]
    fn a_dra_driver_makes_before_it_breaks_and_never_costs_a_slot() {
        assert_eq!(
            next_step(Old, Toward::New, MakeBeforeBreak, serving_old()),
            HandoverStep::Move {
                to: Surge,
                costs: false
            }
        );
        // The new instance is Ready but has not published the pool yet.
        let starting = NodeAgents {
            new_present: true,
            ..serving_old()
        };
        assert_eq!(
            next_step(Surge, Toward::New, MakeBeforeBreak, starting),
            HandoverStep::Wait(HandoverWait::Arriving)
        );
        assert_eq!(
            next_step(Surge, Toward::New, MakeBeforeBreak, both_serving()),
            HandoverStep::Move {
                to: New,
                costs: false
            }
        );
    }

    #[test]
    fn a_broken_dra_release_is_reverted_without_ever_deleting_the_old_pod() {
        // The new instance never serves: the node stays at surge until the
        // gate fails, and the revert goes straight back.
        let broken = NodeAgents {
            new_present: true,
            ..serving_old()
        };
        assert_eq!(
            next_step(Surge, Toward::Old, MakeBeforeBreak, broken),
            HandoverStep::Move {
                to: Old,
                costs: false
            }
        );
    }

    #[test]
    fn reverts_walk_the_states_back_in_each_order() {
        assert_eq!(
            next_step(New, Toward::Old, BreakBeforeMake, serving_new()),
            HandoverStep::Move {
                to: Drain,
                costs: true
            }
        );
        assert_eq!(
            next_step(
                Drain,
                Toward::Old,
                BreakBeforeMake,
                NodeAgents {
                    new_present: true,
                    ..NodeAgents::default()
                }
            ),
            HandoverStep::Wait(HandoverWait::Leaving)
        );
        assert_eq!(
            next_step(Drain, Toward::Old, BreakBeforeMake, NodeAgents::default()),
            HandoverStep::Move {
                to: Old,
                costs: false
            }
        );
        assert_eq!(
            next_step(New, Toward::Old, MakeBeforeBreak, serving_new()),
            HandoverStep::Move {
                to: Surge,
                costs: false
            }
        );
        let old_starting = NodeAgents {
            old_present: true,
            ..serving_new()
        };
        assert_eq!(
            next_step(Surge, Toward::Old, MakeBeforeBreak, old_starting),
            HandoverStep::Wait(HandoverWait::Arriving)
        );
    }

    /// Whatever the state and the agents, following the steps reaches the
    /// end, and no step of make-before-break ever leaves a serving node
    /// without a serving agent.
    #[test]
    fn every_state_reaches_its_end_and_make_before_break_never_costs() {
        for order in [BreakBeforeMake, MakeBeforeBreak] {
            for toward in [Toward::New, Toward::Old] {
                for start in STATES {
                    let mut state = start;
                    for _ in 0..4 {
                        // The cluster catches up with the state at once and
                        // every agent present serves.
                        let agents = NodeAgents {
                            old_present: state.target_runs(),
                            old_serving: state.target_runs(),
                            new_present: state.canary_runs(),
                            new_serving: state.canary_runs(),
                        };
                        match next_step(state, toward, order, agents) {
                            HandoverStep::Done => break,
                            HandoverStep::Wait(why) => {
                                panic!(
                                    "{order:?} {toward:?} from {start:?} waits at {state:?}: {why:?}"
                                )
                            }
                            HandoverStep::Move { to, costs } => {
                                if order == MakeBeforeBreak {
                                    assert!(
                                        !costs,
                                        "{toward:?} from {start:?}: {state:?} -> {to:?} costs"
                                    );
                                }
                                state = to;
                            }
                        }
                    }
                    let end = if toward == Toward::New { New } else { Old };
                    assert_eq!(state, end, "{order:?} {toward:?} from {start:?}");
                }
            }
        }
    }
}
