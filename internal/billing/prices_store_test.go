package billing

import (
	"context"
	"reflect"
	"testing"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestPricesRoundTrip: every rate of a price list, single or keyed by disk
// type, GPU model or term, is stored and read back as it was.
func TestPricesRoundTrip(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db := openDB(t, url)
		want := testPrices()
		want.WindowsServer, want.ImageGB = 123, 456 // not the seeded values
		want.TermDiscounts = map[string]int64{"12": 1500}
		if err := db.Tx(ctx, func(tx *store.Tx) error { return savePrices(ctx, tx, want) }); err != nil {
			t.Fatal(err)
		}
		got, err := loadPrices(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("read back %+v, want %+v", got, want)
		}
	})
}
