-- The trigger that makes rows immutable (takes, assets) or append-only (the retention audit,
-- takes_takeremoval): any UPDATE (or DELETE, where its trigger says so) of such a row fails with
-- restrict_violation, naming the table and the row. The triggers are migrations/takes/0002 and
-- 0003; the function is this file (migrations/takes/0004 applies it).
--
-- Written as pg_get_functiondef prints it (tests/apps/test_db_functions.py compares the two). A
-- change here needs a migration that applies the file again.
CREATE OR REPLACE FUNCTION public.inline_forbid_update()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION '% rows are immutable (id %)', TG_TABLE_NAME, OLD.id
        USING ERRCODE = 'restrict_violation';
END;
$function$
