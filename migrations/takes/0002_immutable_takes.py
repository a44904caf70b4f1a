"""Postgres refuses any UPDATE of a take or an asset: they are immutable by construction."""

from django.db import migrations

FORBID_UPDATE = """
CREATE OR REPLACE FUNCTION inline_forbid_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable (id %)', TG_TABLE_NAME, OLD.id
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER takes_take_immutable BEFORE UPDATE ON takes_take
    FOR EACH ROW EXECUTE FUNCTION inline_forbid_update();
CREATE TRIGGER takes_asset_immutable BEFORE UPDATE ON takes_asset
    FOR EACH ROW EXECUTE FUNCTION inline_forbid_update();
"""

ALLOW_UPDATE = """
DROP TRIGGER IF EXISTS takes_take_immutable ON takes_take;
DROP TRIGGER IF EXISTS takes_asset_immutable ON takes_asset;
DROP FUNCTION IF EXISTS inline_forbid_update();
"""


class Migration(migrations.Migration):
    dependencies = [("takes", "0001_initial")]

    operations = [migrations.RunSQL(FORBID_UPDATE, ALLOW_UPDATE)]
