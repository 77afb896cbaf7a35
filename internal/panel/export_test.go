package panel

// HashID is how the store names a session cookie's secret.
var HashID = hashID
