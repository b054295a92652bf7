use super::*;

#[test]
fn every_name_parses_to_its_option() {
    assert_eq!(Calibration::from_name("absmean"), Ok(Calibration::AbsMean));
    assert_eq!(Rounding::from_name("half_even"), Ok(Rounding::HalfEven));
    assert_eq!(
        ScaleRounding::from_name("nearest"),
        Ok(ScaleRounding::Nearest)
    );
}

#[test]
fn an_unknown_name_lists_the_choices() {
    let err = Rounding::from_name("HALF_AWAY").unwrap_err();
    assert_eq!(
        err.to_string(),
        "rounding must be one of ('half_away', 'half_even'), got 'HALF_AWAY'"
    );
    assert!(matches!(err, QuantError::Option(_)));
}
