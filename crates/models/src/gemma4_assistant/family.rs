//! The registry entry of the Gemma 4 assistants (MTP drafters).

use crate::family::{Family, Role};
use crate::gemma4::gguf::ASSISTANT_ARCHITECTURE;

pub static FAMILY: Family = Family {
    name: "Gemma 4 assistant",
    model_types: &["gemma4_assistant"],
    gguf_architectures: || vec![ASSISTANT_ARCHITECTURE],
    role: Role::MtpAssistant,
};
