package billing

import (
	"context"
	"errors"
	"testing"

	"nimbus/internal/metering"
	"nimbus/internal/store/storetest"
)

func testPrices() *PriceList {
	return &PriceList{VCPU: 500000, RAMGB: 200000, DiskGB: map[string]int64{"local": 5000, "network": 8000},
		GPU: map[string]int64{"A100 80GB": 15000000}, PublicIPv4: 250000, WindowsVCPU: 600000, WindowsServer: 10000,
		VolumeGB: 8000, BackupGB: 3000}
}

func TestQuote(t *testing.T) {
	tests := []struct {
		name    string
		c       Choice
		each    int64 // minor units per server-hour
		hourly  int64
		monthly int64
		items   int
		err     error
	}{
		// 2×50 + 4 GB×20 + 40 GB×0.8 + 25 = 100+80+32+25.
		{"std", Choice{VCPUs: 2, RAMMB: 4096, DiskType: "network", DiskGB: 40, PublicIPv4: true}, 237, 237, 237 * 720, 4, nil},
		{"quantity", Choice{VCPUs: 2, RAMMB: 4096, DiskType: "network", DiskGB: 40, PublicIPv4: true, Quantity: 3}, 237, 711, 711 * 720, 4, nil},
		// 512 MB is half a GB: 10; 1 GB local at 0.5 rounds up to 1.
		{"half GB and rounding", Choice{VCPUs: 1, RAMMB: 512, DiskGB: 1}, 61, 61, 61 * 720, 3, nil},
		{"gpu", Choice{VCPUs: 16, RAMMB: 120 * 1024, DiskGB: 200, GPUModel: "A100 80GB", GPUCount: 2},
			800 + 2400 + 100 + 3000, 6300, 6300 * 720, 4, nil},
		// Windows: 4 vCPU × 60 + 1 per server.
		{"windows", Choice{VCPUs: 4, RAMMB: 0, OSType: "Windows"}, 200 + 240 + 1, 441, 441 * 720, 3, nil},
		{"nothing", Choice{}, 0, 0, 0, 0, nil},
		{"unknown gpu", Choice{VCPUs: 1, GPUModel: "H100", GPUCount: 1}, 0, 0, 0, 0, ErrUnpriced},
		{"unknown disk type", Choice{DiskType: "tape", DiskGB: 1}, 0, 0, 0, 0, ErrUnpriced},
		{"negative", Choice{VCPUs: -1}, 0, 0, 0, 0, ErrInvalid},
		{"too many", Choice{VCPUs: 1, Quantity: 10001}, 0, 0, 0, 0, ErrInvalid},
		{"gpu count without model", Choice{GPUCount: 1}, 0, 0, 0, 0, ErrInvalid},
		{"huge", Choice{VCPUs: maxUnits, RAMMB: maxRAMMB, DiskGB: maxUnits, Quantity: maxQuantity}, 0, 0, 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := testPrices().Quote(tt.c, "RUB", 720)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == "huge" {
				if q.Monthly <= 0 || q.Hourly <= 0 {
					t.Fatalf("overflow: %+v", q)
				}
				return
			}
			if q.HourlyEach != tt.each || q.Hourly != tt.hourly || q.Monthly != tt.monthly || len(q.Items) != tt.items {
				t.Fatalf("quote = each %d hourly %d monthly %d items %d, want %d %d %d %d (%+v)",
					q.HourlyEach, q.Hourly, q.Monthly, len(q.Items), tt.each, tt.hourly, tt.monthly, tt.items, q.Items)
			}
			var sum int64
			for _, it := range q.Items {
				sum += it.Hourly
			}
			if sum != q.HourlyEach {
				t.Fatalf("line items sum to %d, hourly_each %d", sum, q.HourlyEach)
			}
		})
	}
}

// TestSeededPrices checks the migration's defaults load and quote like the
// literal list above.
func TestSeededPrices(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		p, err := loadPrices(context.Background(), db)
		if err != nil {
			t.Fatal(err)
		}
		want := testPrices()
		want.WindowsServer = 0
		want.GPU["L4"] = 4000000
		if p.VCPU != want.VCPU || p.RAMGB != want.RAMGB || p.DiskGB["network"] != 8000 || p.GPU["L4"] != 4000000 ||
			p.WindowsServer != 0 || p.BackupGB != 3000 {
			t.Fatalf("seeded prices = %+v", p)
		}
		if err := p.validate(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHourlyOf prices each kind of metered resource from its spec, and a
// server whose GPU model is no longer sold at what is still priced.
func TestHourlyOf(t *testing.T) {
	p := testPrices()
	tests := []struct {
		kind    string
		spec    metering.Spec
		want    int64
		wantErr bool
	}{
		{metering.KindPublicIP, metering.Spec{PublicIPv4: true}, 25, false},
		{metering.KindBackup, metering.Spec{SizeGB: 30}, 9, false}, // 30 × 0.3 = 9
		{metering.KindVolume, metering.Spec{SizeGB: 100}, 80, false},
		{metering.KindServer, metering.ServerSpec("f", 2, 4096, 40, map[string]string{"nimbus:disk_type": "network"}, ""), 100 + 80 + 32, false},
		{metering.KindServer, metering.ServerSpec("f", 2, 4096, 40, map[string]string{"nimbus:gpu_model": "Z9"}, ""), 100 + 80 + 20, true},
	}
	for _, tc := range tests {
		got, err := p.HourlyOf(tc.kind, tc.spec, "RUB", 720)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s %+v: %d, %v; want %d (error %v)", tc.kind, tc.spec, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestTermPrice: months × 720 hours less the term's discount, rounded up.
func TestTermPrice(t *testing.T) {
	p := testPrices()
	p.TermDiscounts = map[string]int64{"1": 0, "3": 500, "12": 1500}
	tests := []struct {
		hourly  int64
		months  int
		want    int64
		wantErr error
	}{
		{100, 1, 72000, nil},
		{100, 3, 205200, nil}, // 216000 × 0.95
		{7, 12, 51408, nil},   // 60480 × 0.85 = 51408
		{3, 3, ceilDiv(6480*9500, 10000), nil},
		{100, 2, 0, ErrUnpriced},
	}
	for _, tc := range tests {
		got, err := p.TermPrice(tc.hourly, tc.months, 720)
		if got != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("TermPrice(%d, %d) = %d, %v; want %d, %v", tc.hourly, tc.months, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestWithTariff prices a choice for the whole term or rental duration.
func TestWithTariff(t *testing.T) {
	p := testPrices()
	p.TermDiscounts = map[string]int64{"1": 0, "3": 500}
	base, err := p.Quote(Choice{VCPUs: 2, RAMMB: 4096, DiskGB: 40, Quantity: 3}, "RUB", 720)
	if err != nil {
		t.Fatal(err)
	}
	each3, _ := p.TermPrice(base.HourlyEach, 3, 720)
	tests := []struct {
		tariff  string
		months  int
		hours   int64
		total   int64
		wantErr error
	}{
		{"", 0, 0, base.Monthly, nil}, // no duration: one month of 720 hours
		{"hourly", 0, 48, base.Hourly * 48, nil},
		{"prepaid", 3, 0, each3 * 3, nil},
		{"prepaid", 2, 0, 0, ErrUnpriced},
		{"prepaid", 3, 10, 0, ErrInvalid},
		{"hourly", 3, 0, 0, ErrInvalid},
		{"hourly", 0, -1, 0, ErrInvalid},
		{"yearly", 0, 0, 0, ErrInvalid},
	}
	for _, tc := range tests {
		q, err := p.WithTariff(base, tc.tariff, tc.months, tc.hours)
		if !errors.Is(err, tc.wantErr) || (err == nil && q.Total != tc.total) {
			t.Errorf("WithTariff(%q, %d, %d) = %d, %v; want %d, %v", tc.tariff, tc.months, tc.hours, q.Total, err, tc.total, tc.wantErr)
		}
	}
}
