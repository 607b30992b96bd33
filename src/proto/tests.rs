//! Unit tests of the state machine driven by hand (the simulator tests the swarm).
