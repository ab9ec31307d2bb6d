//! Round-loop state machine tests over a table-driven target.

mod support;

mod budgets_and_stops;
mod cancellation;
mod constrained;
mod cost_aware;
mod failures;
mod hybrid;
mod lossless;
mod ngram;
mod opening;
mod property;
