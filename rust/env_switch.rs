//! The `OXILLAMA_*` switches that turn a default behaviour off.

/// Whether the switch `name` leaves its behaviour on: unset, or anything
/// but the usual spellings of off ("0", "off", "false", "no", any case).
pub fn on(name: &str) -> bool {
    on_value(std::env::var(name).ok().as_deref())
}

fn on_value(value: Option<&str>) -> bool {
    !matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "off" | "false" | "no")
    )
}

#[cfg(test)]
mod tests {
    use super::on_value;

    #[test]
    fn the_usual_spellings_of_off_turn_it_off_and_nothing_else_does() {
        for off in ["0", "off", "FALSE", " no ", "Off"] {
            assert!(!on_value(Some(off)), "{off}");
        }
        for on in [None, Some("1"), Some("on"), Some(""), Some("yes")] {
            assert!(on_value(on), "{on:?}");
        }
    }
}
