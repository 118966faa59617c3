//! The plan's JSON form (serde), for dumps and for plans written by other tools.

use crate::error::{PlanError, Result};
use crate::plan::Plan;

impl Plan {
    /// The JSON form; constants read back exactly (`Literal`'s serde form).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan JSON serialization cannot fail")
    }

    /// Reads the JSON form and validates the plan it describes ([`Plan::validate`]), so a plan
    /// from outside is never run unchecked.
    pub fn from_json(text: &str) -> Result<Plan> {
        let plan: Plan = serde_json::from_str(text).map_err(|e| PlanError::Json(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }
}
